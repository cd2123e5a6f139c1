-- bounds.lua owns the per-customer caps of invariant 13 (docs/limits.md),
-- in one place because every script that adds a block or a reservation refuses
-- past them, and a customer's size bounds what each script reads.
--
-- A customer holds at most MAX_LIVE_BLOCKS live blocks and
-- MAX_ACTIVE_RESERVATIONS active reservations; a script that would create one more
-- refuses with TOOMANYBLOCKS or TOOMANYRESERVATIONS and changes nothing.
-- engine.MaxLiveBlocks and engine.MaxActiveReservations mirror them (a test keeps
-- the pairs equal).
local MAX_LIVE_BLOCKS = 100
local MAX_ACTIVE_RESERVATIONS = 100
-- At most MAX_KEPT_RESERVATIONS finalized reservations stay in the hash for their
-- RES_KEEP_MS; past that the oldest leave early (engine then reads their
-- final status from Postgres, as after RES_KEEP_MS).
local MAX_KEPT_RESERVATIONS = 8
