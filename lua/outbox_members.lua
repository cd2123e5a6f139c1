-- outbox_members.lua announces a persister as live and counts the live
-- ones (engine.OutboxLeases.Persisters), so each takes about its share of
-- the outbox partitions (issue 25). Times are Redis' clock, so the nodes'
-- clocks do not matter.
--
-- KEYS[1]  sorted set: consumer -> end of its announcement (ms)
-- ARGV[1]  consumer
-- ARGV[2]  ttl in milliseconds; 0 withdraws consumer
--
-- Reply: the live persisters, consumer included unless withdrawn.
-- Errors: BADARG.
local key, consumer, ttl = KEYS[1], ARGV[1], tonumber(ARGV[2])
if consumer == '' or not ttl or ttl < 0 then
  return redis.error_reply('BADARG outbox members: consumer must be non-empty and ttl not negative')
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
if ttl == 0 then
  redis.call('ZREM', key, consumer)
else
  redis.call('ZADD', key, now + ttl, consumer)
  -- The latest announcement ends last: the set goes with it.
  redis.call('PEXPIRE', key, ttl)
end
return redis.call('ZCARD', key)
