-- idem_abort.lua drops an in-progress HTTP idempotency record of one
-- fingerprint: the request changed nothing, so its retry must run afresh. A
-- finished record, or one of another fingerprint, is kept. (A compare and
-- delete needs a script; it runs only after a 5xx or 429, never on the
-- usual path.)
--
-- KEYS[1]  the record (see lua/idempotency.go for its encoding)
-- ARGV[1]  the in-progress record of the request that gives up
--
-- Reply: 1 when it deleted the record, else 0.
local cur = redis.call('GET', KEYS[1])
if cur and cur == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
