-- reservation_note.lua appends a reservation notice to a tenant's change feed (issue 27):
-- a reservation create, commit or release moved a customer's reserved and
-- effective balance, which no event reports, so a client answering checks
-- from memory hears of it here. Not a money script: it runs after the
-- reservation's own script answered, and touches only the feed.
-- Trimmed as a config change's feed is (prelude feed_trim).
--
-- KEYS[1]  the tenant's stamps hash (for the horizon)
-- KEYS[2]  the tenant's change feed, a stream (same hash tag)
-- ARGV[1]  the customer's id
-- ARGV[2]  the customer's environment
-- ARGV[3]  the feed's cap (an integer >= 1): it keeps at least that many
--          entries and at most a tenth more (stamp.lua), checked after
--          this entry; or "0": no check this time (a node asks for one
--          every feedTrimEvery notices, lua/changes.go appendNoteArgs: an
--          XLEN on every notice was a tenth of its instructions)
-- ARGV[4]  optional: the fleet's change feed wake channel (as in stamp.lua);
--          "" for none when ARGV[6] follows
-- ARGV[5]  with ARGV[4]: the wake message
-- ARGV[6]  optional: the entry's stamp, Unix µs as decimal text (the
--          caller's clock: a TIME and its formatting cost a notice a tenth
--          of its instructions); absent, the server's clock
--
-- Reply: the new entry's id.
local stamps = KEYS[1]
local feed = KEYS[2]
local customer = ARGV[1]
local env = ARGV[2]
local feedCap = tonumber(ARGV[3])

local now = ARGV[6]
if not now then
  local t = redis.call('TIME')
  now = string.format('%.0f', tonumber(t[1]) * 1000000 + tonumber(t[2]))
end
local id = redis.call('XADD', feed, '*', 'kind', 'h', 'stamp', now, 'customer', customer, 'env', env)
if feedCap > 0 then feed_trim(feed, stamps, feedCap) end
if ARGV[4] and ARGV[4] ~= '' then
  redis.call('PUBLISH', ARGV[4], ARGV[5])
end
return id
