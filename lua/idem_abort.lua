-- idem_abort.lua drops an in-progress HTTP idempotency record of one request
-- hash: the request changed nothing, so its retry must run afresh. A finished
-- record, or one of another request, is kept.
--
-- KEYS[1]  the record hash (see idem_begin.lua for its fields)
-- ARGV[1]  request hash of the request that gives up
--
-- Reply: 1 when it deleted the record, else 0.
local key = KEYS[1]
local request_hash = ARGV[1]

local f = redis.call('HMGET', key, 'rh', 'd')
if f[1] == request_hash and f[2] == '0' then
  redis.call('DEL', key)
  return 1
end
return 0
