-- idem_finish.lua stores the response of the request that claimed an HTTP
-- idempotency key, for replays until the TTL ends.
--
-- KEYS[1]  the record hash (see idem_begin.lua for its fields)
-- ARGV[1]  request hash of the request that ran
-- ARGV[2]  HTTP status
-- ARGV[3]  content type
-- ARGV[4]  body
-- ARGV[5]  TTL in ms (24 h: interface.md Common rules 1)
--
-- It writes only when the record is ours and in progress, or gone (our lock
-- lapsed and nobody claimed since: the response is still the first one). It
-- leaves alone a record of another request hash, and a finished record, whose
-- response was the first and must stay the one replayed.
--
-- Reply: 1 when it stored the response, 0 when it left the record alone.
local key = KEYS[1]
local request_hash = ARGV[1]

local f = redis.call('HMGET', key, 'rh', 'd')
if f[1] and (f[1] ~= request_hash or f[2] == '1') then
  return 0
end

redis.call('HSET', key, 'rh', request_hash, 'd', '1', 's', ARGV[2], 'ct', ARGV[3], 'b', ARGV[4])
redis.call('PEXPIRE', key, ARGV[5])
return 1
