-- gcra.lua spends requests of an API key's rate budget, shared by every
-- creditd node: the generic cell rate algorithm (GCRA) of go-redis/redis_rate,
-- with a cost: a node takes a lease of n requests at once and serves them
-- from memory (api/ratelimit.go), so Redis sees one call per lease.
-- The key holds the theoretical arrival time (TAT) in microseconds: the time
-- at which the budget would be full again if no request came. A request is
-- allowed when TAT + interval - burst * interval <= now; a refusal writes
-- nothing, as a token bucket spends nothing on a refused request.
--
-- KEYS[1]  the budget's TAT, a string of whole microseconds (hash-tagged
--          with the tenant so the script runs on Redis Cluster)
-- ARGV[1]  rate: requests per second, >= 1
-- ARGV[2]  burst: requests the budget holds, >= 1
-- ARGV[3]  now in microseconds since the epoch; 0 reads the server's TIME,
--          the one clock all nodes share (tests pass a fake clock)
-- ARGV[4]  requests wanted, >= 1 (absent: 1). All of them when they fit;
--          else as many as fit (so a small budget is still spent exactly);
--          else none: TAT advances one interval per request granted.
-- KEYS[2], ARGV[5], ARGV[6]  optional fence: the tenant's stamps hash, a
--          stamp's field and the value the caller read its limits under
--          (decimal; an absent field is 0). When the field holds another
--          value the limits may be old: nothing is taken and the reply is
--          {-1, 0, 0, 0}.
--
-- Reply: {granted requests (0 when refused), remaining whole requests,
-- retry after (one request) in microseconds (0 when granted), reset (until
-- full) in microseconds}.
-- Errors: BADARG when an argument is not a positive number.
local key = KEYS[1]
local rate = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local now = tonumber(ARGV[3])
local want = tonumber(ARGV[4] or '1')

if not rate or rate < 1 or not burst or burst < 1 or not now or now < 0 or not want or want < 1 then
  return redis.error_reply('BADARG gcra: rate, burst, now and requests must be positive numbers')
end
want = math.floor(want)
if KEYS[2] and (redis.call('HGET', KEYS[2], ARGV[5]) or '0') ~= ARGV[6] then
  return {-1, 0, 0, 0}
end
if now == 0 then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end

local interval = 1000000 / rate -- microseconds per request
local capacity = interval * burst -- microseconds the budget spans
-- Microseconds are whole in the stored TAT; intervals like 1/3 s are not,
-- so comparisons allow this much rounding.
local slack = 0.5

local stored = redis.call('GET', key)
local tat = stored and tonumber(stored) or now
if tat < now then
  tat = now
end
-- Whole requests the budget holds now (TAT + k * interval <= now + capacity).
local fits = math.floor((now + capacity - tat + slack) / interval)

local function whole(us)
  return math.floor(us + 0.5)
end

if fits < 1 then
  -- Refused: one request fits once TAT + interval - capacity is reached.
  return {0, 0, whole(tat + interval - capacity - now), whole(tat - now)}
end

local granted = math.min(want, fits)
local new_tat = tat + granted * interval
-- What the budget holds after these requests, in microseconds of refill.
local left = now + capacity - new_tat
-- The key outlives TAT by 10 s: a missing key and a TAT in the past mean the
-- same full budget (tat = now above), so the grace changes no decision; it
-- only keeps a caller whose clock runs behind the key's writer (another
-- node's, a test's fake clock while the box stalls) from finding the key
-- expired early and a fresh budget.
redis.call('SET', key, string.format('%.0f', new_tat), 'PX', math.ceil((new_tat - now) / 1000) + 10000)
local remaining = math.floor((left + slack) / interval)
if remaining < 0 then
  remaining = 0
end
return {granted, remaining, 0, whole(new_tat - now)}
