-- seen_add.lua records operations the persister has committed to Postgres
-- in the seen filter (prelude/seen.lua seen_put) and then shortens their op
-- keys to the grace (engine.OpKeyGrace), in one script, so an applied
-- idempotency key is always under its op key, in the filter, or both.
--
-- KEYS[1]    the partition's filter hash of this period
--            {prefix:pNN}:seen:p<period>
-- KEYS[2..]  op keys of committed operations of the partition
-- ARGV[1]    grace in ms                ARGV[2] the hash's TTL in ms
local wk, grace, expires = KEYS[1], ARGV[1], ARGV[2]
for i = 2, #KEYS do
  seen_put(wk, KEYS[i])
  redis.call('PEXPIRE', KEYS[i], grace)
end
redis.call('PEXPIRE', wk, expires)
return #KEYS - 1
