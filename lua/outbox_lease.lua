-- outbox_lease.lua takes, renews or releases the lease of one outbox
-- partition (engine.OutboxLeases, issue 25): only the partition's owner
-- reads it, so its entries are applied in stream order across a fleet.
-- The keys share the partition's hash tag, so this runs on Redis Cluster.
--
-- The fencing token of a take is max(last token + 1, Redis' clock in µs):
-- it grows with every take, and still grows after the counter was lost (a
-- flushed Redis, a failover that dropped the last take) unless the clock
-- went back by more than the time since that take.
--
-- KEYS[1]  the lease: string "<token>|<consumer>", expiring with the lease
-- KEYS[2]  the partition's last token (no expiry)
-- ARGV[1]  take, renew or release
-- ARGV[2]  consumer
-- ARGV[3]  token (renew, release; ignored by take)
-- ARGV[4]  ttl in milliseconds, >= 1 (take, renew)
--
-- Reply: take: the new token, 0 when another consumer holds the lease;
-- renew and release: 1 when the lease was consumer's with token, else 0.
-- Errors: BADARG.
local lease, last = KEYS[1], KEYS[2]
local mode, consumer, token, ttl = ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4])

if consumer == '' or string.find(consumer, '|', 1, true) then
  return redis.error_reply('BADARG outbox lease: consumer must be non-empty and hold no |')
end
local cur = redis.call('GET', lease)

if mode == 'take' then
  if not ttl or ttl < 1 then return redis.error_reply('BADARG outbox lease: ttl must be a positive number') end
  if cur then
    local sep = string.find(cur, '|', 1, true)
    if not sep or string.sub(cur, sep + 1) ~= consumer then return 0 end
  end
  local t = redis.call('TIME')
  local next_token = tonumber(t[1]) * 1000000 + tonumber(t[2])
  local prev = tonumber(redis.call('GET', last) or '0') or 0
  if prev + 1 > next_token then next_token = prev + 1 end
  local s = string.format('%.0f', next_token)
  redis.call('SET', last, s)
  redis.call('SET', lease, s .. '|' .. consumer, 'PX', ttl)
  return next_token
end

if cur ~= token .. '|' .. consumer then return 0 end
if mode == 'renew' then
  if not ttl or ttl < 1 then return redis.error_reply('BADARG outbox lease: ttl must be a positive number') end
  redis.call('PEXPIRE', lease, ttl)
  return 1
end
if mode == 'release' then
  redis.call('DEL', lease)
  return 1
end
return redis.error_reply('BADARG outbox lease: mode must be take, renew or release')
