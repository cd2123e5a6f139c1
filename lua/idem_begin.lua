-- idem_begin.lua claims an HTTP idempotency key for one request, atomically,
-- so of any number of racing requests with the same key exactly one runs.
--
-- KEYS[1]  the record hash ({prefix:t:<tenant>}:idem:<sha256(key)>)
-- ARGV[1]  request hash of the caller
-- ARGV[2]  lock TTL in ms: an in-progress record lapses after it, so a retry
--          can run again when the claimer crashed before Finish or Abort
--
-- Record fields: rh request hash, d done ("0" in progress, "1" finished),
-- s HTTP status, ct content type, b body.
--
-- Reply: {1} when this call created the in-progress record (claimed), else
-- {0, rh, d, s, ct, b} of the record as it stands (absent fields are nil).
local key = KEYS[1]
local request_hash = ARGV[1]
local lock_ttl_ms = ARGV[2]

if redis.call('EXISTS', key) == 0 then
  redis.call('HSET', key, 'rh', request_hash, 'd', '0')
  redis.call('PEXPIRE', key, lock_ttl_ms)
  return {1}
end

local f = redis.call('HMGET', key, 'rh', 'd', 's', 'ct', 'b')
return {0, f[1], f[2], f[3], f[4], f[5]}
