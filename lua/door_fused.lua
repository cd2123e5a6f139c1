-- door_fused.lua: the fused door (engine.FusedDoor, lua/door_fused.go),
-- defined once in the Functions library after BODY (the scripts' bodies by
-- name), never in a script of its own. door_run runs a money script's body
-- under a request's door on a single Redis: the tenant's stamps checked
-- against the ones the request's caches were read under, the key's rate
-- budget taken (gcra.lua), and the Idempotency-Key's record claimed, all in
-- the script's one round trip instead of a door trip before it (issue 26).
--
-- K[1]     the tenant's stamps hash        K[2] the key's record
-- K[3]     the rate budget's key ("" when the rate is not asked)
-- K[4]     the tenant's change feed ("" when no reservation notice is asked)
-- K[5..]   the body's KEYS
-- A[1]     n, the stamps checked (0: a node alone)
-- A[2..1+n]    their fields     A[2+n..1+2n] their values as decimal text
-- then, from b = 2+2n:
-- A[b]     the in-progress record (a claim's)
-- A[b+1]   the rerun record (a money call's "done, replay by re-running")
-- A[b+2]   the in-progress record's TTL ms     A[b+3] the rerun's TTL ms
-- A[b+4..b+7] gcra.lua's ARGV[1..4] (ignored when K[3] is "")
-- A[b+8..b+12] reservation_note.lua's ARGV[1..5] (ignored when K[4] is ""; an
--          empty wake channel is none): after an answer that is not a
--          replay, the reservation notice engine.NotingReservations would append after
--          the script, in the same round trip
-- A[b+13..] the body's ARGV
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
local door_retried = {NOSTATE = true, MAYBESEEN = true, STALE = true}

local function door_run(K, A, body)
  local n = tonumber(A[1])
  if n > 0 then
    local fields = {}
    for i = 1, n do fields[i] = A[1 + i] end
    local got = redis.call('HMGET', K[1], unpack(fields))
    for i = 1, n do
      if (got[i] or '0') ~= A[1 + n + i] then return {'door', 'stale', -2, 0, 0, 0} end
    end
  end
  if redis.call('EXISTS', K[2]) == 1 then return {'door', 'stale', -2, 0, 0, 0} end
  local b = 2 + 2 * n
  local rate = {-2, 0, 0, 0}
  if K[3] ~= '' then
    rate = BODY['gcra']({K[3]}, {A[b + 4], A[b + 5], A[b + 6], A[b + 7]})
    if rate.err then return {'door', 'stale', -2, 0, 0, 0} end -- the usual path's take answers it
    if rate[1] < 1 then return {'door', 'rate', rate[1], rate[2], rate[3], rate[4]} end
  end
  local keys, argv = {}, {}
  for i = 5, #K do keys[i - 4] = K[i] end
  for i = b + 13, #A do argv[i - b - 12] = A[i] end
  local r = body(keys, argv)
  if type(r) == 'table' and r.err then
    local what = 'retry'
    if not door_retried[string.match(r.err, '^%u+') or ''] then
      redis.call('SET', K[2], A[b], 'PX', A[b + 2])
      what = 'err'
    end
    return {'door', what, rate[1], rate[2], rate[3], rate[4], r.err}
  end
  redis.call('SET', K[2], A[b + 1], 'PX', A[b + 3])
  if K[4] ~= '' and r[1] ~= 'replay' then
    local wake = A[b + 11]
    if wake == '' then wake = nil end
    BODY['reservation_note']({K[1], K[4]}, {A[b + 8], A[b + 9], A[b + 10], wake, A[b + 12]})
  end
  return {'door', 'ok', rate[1], rate[2], rate[3], rate[4], r[1], r[2]}
end
