-- gauge_value.lua reads one gauge counter of a customer, read-only, at
-- now: slots of leases past their expires (field "L:<metric>", prelude
-- "Gauge leases") no longer count, though no script has written the
-- lapse yet.
--
-- KEYS[1]  account hash {prefix:pNN}:a:<customer>
-- ARGV[1]  metric key     ARGV[2]  now, Unix ms
--
-- Reply: the count as a decimal string ("0" when never used); error
-- NOSTATE when the customer's state is not in Redis.
if redis.call('EXISTS', KEYS[1]) == 0 then
  return redis.error_reply('NOSTATE no credit state for the customer')
end
local v = redis.call('HMGET', KEYS[1], 'g:' .. ARGV[1], 'L:' .. ARGV[1])
local count, leases, now = v[1] or '0', v[2], tonumber(ARGV[2])
if not leases or not now then return count end
local n, lapsed = tonumber(count), false
for amt, exp in string.gmatch(leases, '[^, ]+,(%d+),(%d+),%d+,%d+') do
  if tonumber(exp) <= now then
    n, lapsed = n - tonumber(amt), true
  end
end
if not lapsed then return count end
if n < 0 then n = 0 end
return string.format('%d', n)
