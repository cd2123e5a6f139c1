-- idem_finish.lua stores the final answer of the request that claimed an
-- HTTP idempotency key, when the caller cannot be sure its claim still
-- stands (the request ran for a good part of the lock TTL). The usual
-- Finish is a plain SET: a claim taken moments ago is certainly still ours.
--
-- KEYS[1]  the record (see lua/idempotency.go for its encoding: one state
--          byte, 'p' in progress, 'r' or 'd' finished, then the 11-byte
--          fingerprint)
-- ARGV[1]  the finished record
-- ARGV[2]  TTL in ms (24 h: docs/spec/interface.md Common rules 1)
--
-- It writes only when the record is ours and in progress, or gone (our lock
-- lapsed and nobody claimed since: the answer is still the first one). It
-- leaves alone a record of another fingerprint, and a finished record, whose
-- answer was the first and must stay the one replayed.
--
-- Reply: 1 when it stored the record, 0 when it left the record alone.
local key = KEYS[1]
local rec = ARGV[1]

local cur = redis.call('GET', key)
if cur and (string.sub(cur, 1, 1) ~= 'p' or string.sub(cur, 2, 12) ~= string.sub(rec, 2, 12)) then
  return 0
end
redis.call('SET', key, rec, 'PX', ARGV[2])
return 1
