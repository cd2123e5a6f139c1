-- gcra.lua spends one request of an API key's rate budget, shared by every
-- creditd node: the generic cell rate algorithm (GCRA) of go-redis/redis_rate.
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
--
-- Reply: {allowed (1|0), remaining whole requests, retry after in
-- microseconds (0 when allowed), reset (until full) in microseconds}.
-- Errors: BADARG when an argument is not a positive number.
local key = KEYS[1]
local rate = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local now = tonumber(ARGV[3])

if not rate or rate < 1 or not burst or burst < 1 or not now or now < 0 then
  return redis.error_reply('BADARG gcra: rate, burst and now must be positive numbers')
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
local new_tat = tat + interval
-- What the budget holds after this request, in microseconds of refill.
local left = now + capacity - new_tat

local function whole(us)
  return math.floor(us + 0.5)
end

if left < -slack then
  return {0, 0, whole(-left), whole(tat - now)}
end

redis.call('SET', key, string.format('%.0f', new_tat), 'PX', math.max(1, math.ceil((new_tat - now) / 1000)))
local remaining = math.floor((left + slack) / interval)
if remaining < 0 then
  remaining = 0
end
return {1, remaining, 0, whole(new_tat - now)}
