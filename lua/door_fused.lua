-- door_fused.lua: the fused door (engine.FusedDoor, lua/door_fused.go),
-- defined once in the Functions library after BODY (the scripts' bodies by
-- name), never in a script of its own. door_run runs a money script's body
-- under a request's door on a single Redis: the tenant's stamps checked
-- against the ones the request's caches were read under, the key's rate
-- budget taken (gcra.lua), and the Idempotency-Key's record claimed, all in
-- the script's one round trip instead of a door trip before it (issue 26).
--
-- The body's KEYS and ARGV come first, as the body reads them, and the
-- door's after them: door_run takes its own off the ends of the tables
-- Redis built and hands the body those same tables (the copies, with the
-- arguments a door did not need, cost a consume ~37,000 instructions:
-- docs/decisions.md "The fused door hands the body Redis's own KEYS").
--
-- K[1..]   the body's KEYS, then the door's: the tenant's stamps hash, the
--          key's record, the rate budget's key (only when a rate is asked),
--          the tenant's change feed (only when a reservation notice is
--          asked), the reservation's index record (only when it is asked:
--          lua/hotpath.go reserve)
-- A[1..]   the body's ARGV, then the door's, from d (A[#A], the shape,
--          says how many there are: DOOR_SHAPE):
-- A[d]     the in-progress record (a claim's)
-- A[d+1]   the rerun record (a money call's "done, replay by re-running")
-- A[d+2]   the in-progress record's TTL ms     A[d+3] the rerun's TTL ms
-- then, each only when the shape has it:
--          the six stamps' values as decimal text joined by spaces, in
--          the fields' order (engine.StampFields: t c m p s a; an absent
--          field is 0): one argument, not six (a node alone checks none)
--          gcra.lua's ARGV[1..4]
--          reservation_note.lua's ARGV[1..6] (an empty wake channel is
--          none): after an answer that is not a replay, the reservation
--          notice engine.NotingReservations would append after the script,
--          in the same round trip
--          the index record and its TTL ms: after an answer that is not a
--          replay, written as lua/hotpath.go indexReservation would write
--          it after the script, in the same round trip
-- A[#A]    the shape: "0".."15", 1 stamps checked + 2 rate asked + 4 notice
--          asked + 8 index asked (lua/door_fused.go doorShapeArgs)
--
-- Reply, always {"door", what, granted, remaining, retry us, reset us, ...}
-- with gcra.lua's figures (granted -2: no rate asked):
--   "stale"            a stamp moved or the key has a record: nothing ran
--   "rate"             the budget refused: nothing else ran
--   "ok", status, body the body's answer; the record is the rerun mark
--   "err", text        the body's refusal; the record is the claim (the
--                      caller stores the refusal as any claimed request's)
--   "retry", text      the body's error asking to be run again (NOSTATE,
--                      MAYBESEEN, STALE): no record written

-- DOOR_SHAPE[shape] is {stamps checked, rate asked, notice asked, index
-- asked, the door's ARGV, the door's KEYS}.
local DOOR_SHAPE = {
  ['0'] = {false, false, false, false, 5, 2}, ['1'] = {true, false, false, false, 6, 2}, ['2'] = {false, true, false, false, 9, 3}, ['3'] = {true, true, false, false, 10, 3},
  ['4'] = {false, false, true, false, 11, 3}, ['5'] = {true, false, true, false, 12, 3}, ['6'] = {false, true, true, false, 15, 4}, ['7'] = {true, true, true, false, 16, 4},
  ['8'] = {false, false, false, true, 7, 3}, ['9'] = {true, false, false, true, 8, 3}, ['10'] = {false, true, false, true, 11, 4}, ['11'] = {true, true, false, true, 12, 4},
  ['12'] = {false, false, true, true, 13, 4}, ['13'] = {true, false, true, true, 14, 4}, ['14'] = {false, true, true, true, 17, 5}, ['15'] = {true, true, true, true, 18, 5},
}
local DOOR_NO_RATE = {-2, 0, 0, 0}

local function door_run(K, A, body)
  DOOR.record = nil -- left set by a body that raised an error
  local na, nk = #A, #K
  local shape = DOOR_SHAPE[A[na]]
  if not shape then return redis.error_reply('BADARG the fused door\'s shape') end
  local d, k = na - shape[5] + 1, nk - shape[6] + 1
  local stamps_key, record_key = K[k], K[k + 1]
  -- The optional keys follow in the shape's order: rate, feed, index.
  local index_key = shape[4] and K[nk] or nil
  local feed_key = shape[3] and K[index_key and nk - 1 or nk] or nil
  local i = d + 4
  if shape[1] then
    local got = redis.call('HMGET', stamps_key, 't', 'c', 'm', 'p', 's', 'a')
    -- Equal joined exactly when equal one by one: the values are digits.
    if (got[1] or '0') .. ' ' .. (got[2] or '0') .. ' ' .. (got[3] or '0') .. ' ' .. (got[4] or '0') .. ' ' ..
        (got[5] or '0') .. ' ' .. (got[6] or '0') ~= A[i] then
      return DOOR.stale
    end
    i = i + 1
  end
  -- Without a rate to take, the body's replay reads the key's record with
  -- its op key (one MGET: an EXISTS less); with one, the record is read
  -- first, so a stale door never spends the budget.
  if shape[2] and redis.call('EXISTS', record_key) == 1 then return DOOR.stale end
  local rate = DOOR_NO_RATE
  if shape[2] then
    rate = BODY['gcra']({K[k + 2]}, {A[i], A[i + 1], A[i + 2], A[i + 3]})
    if rate.err then return DOOR.stale end -- the usual path's take answers it
    if rate[1] < 1 then return {'door', 'rate', rate[1], rate[2], rate[3], rate[4]} end
    i = i + 4
  end
  local running, rerun, running_ms, rerun_ms = A[d], A[d + 1], A[d + 2], A[d + 3]
  local n1, n2, n3, wake, n5, n6
  if shape[3] then
    n1, n2, n3, wake, n5, n6 = A[i], A[i + 1], A[i + 2], A[i + 3], A[i + 4], A[i + 5]
    i = i + 6
  end
  local index_rec, index_ms = A[i], A[i + 1] -- read only with index_key
  -- The body sees only its own: its scripts read #KEYS and #ARGV.
  for j = d, na do A[j] = nil end
  for j = k, nk do K[j] = nil end
  if not shape[2] then DOOR.record = record_key end
  local r = body(K, A)
  -- Still set: the body answered before its replay read the record.
  local unchecked = DOOR.record ~= nil
  DOOR.record = nil
  if r == DOOR.held then return DOOR.stale end
  if type(r) == 'table' and r.err then return DOOR.refused(r.err, record_key, running, running_ms, rate, unchecked) end
  -- Every money body reads its replay before it writes: one that did not
  -- would have run without the record's check.
  if unchecked then error('door_run: the body answered without reading the idempotency record') end
  redis.call('SET', record_key, rerun, 'PX', rerun_ms)
  if r[1] ~= 'replay' then
    if feed_key then BODY['reservation_note']({stamps_key, feed_key}, {n1, n2, n3, wake, n5, n6}) end
    if index_key then redis.call('SET', index_key, index_rec, 'PX', index_ms) end
  end
  return {'door', 'ok', rate[1], rate[2], rate[3], rate[4], r[1], r[2]}
end
