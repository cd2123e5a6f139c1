-- gauge_value.lua reads one gauge counter of a customer, read-only.
--
-- KEYS[1]  account hash {prefix:pNN}:a:<customer>
-- ARGV[1]  metric key
--
-- Reply: the count as a decimal string ("0" when never used); error
-- NOSTATE when the customer's state is not in Redis.
if redis.call('EXISTS', KEYS[1]) == 0 then
  return redis.error_reply('NOSTATE no credit state for the customer')
end
return redis.call('HGET', KEYS[1], 'g:' .. ARGV[1]) or '0'
