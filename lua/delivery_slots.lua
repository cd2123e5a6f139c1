-- delivery_slots.lua takes one of a tenant's webhook delivery slots, shared
-- by every creditd node, so the tenant's cap on attempts in flight holds for
-- the fleet, not per process. A slot is leased: a node that dies holding
-- one frees it when the lease ends. Release is a plain ZREM.
--
-- KEYS[1]  the tenant's slots: a sorted set of holder -> lease end (ms)
-- ARGV[1]  holder: the event claim's lease token
-- ARGV[2]  limit: slots the tenant may hold, >= 1
-- ARGV[3]  lease in milliseconds, >= 1
-- ARGV[4]  now in milliseconds since the epoch; 0 reads the server's TIME
--
-- Reply: 1 when holder holds a slot (taken or renewed), 0 when all are held.
-- Errors: BADARG when limit, lease or now is not a positive number.
local key = KEYS[1]
local holder = ARGV[1]
local limit = tonumber(ARGV[2])
local lease = tonumber(ARGV[3])
local now = tonumber(ARGV[4])

if not limit or limit < 1 or not lease or lease < 1 or not now or now < 0 then
  return redis.error_reply('BADARG delivery slots: limit, lease and now must be positive numbers')
end
if now == 0 then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
if redis.call('ZSCORE', key, holder) or redis.call('ZCARD', key) < limit then
  redis.call('ZADD', key, now + lease, holder)
  -- The newest lease ends last: the set goes with it once all have ended.
  redis.call('PEXPIRE', key, lease)
  return 1
end
return 0
