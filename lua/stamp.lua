-- stamp.lua moves one of a tenant's change stamps (issue 25): every node
-- reads a tenant's stamps once per request and drops what it cached under
-- older ones, so a write that changed cached facts moves the stamp of their
-- kind before it answers (engine.Stamps).
-- A stamp only grows, even across a Redis that lost it (restarted without
-- persistence, a failover to a replica that had not received the last
-- bump): the new value is the server's clock in microseconds, or one more
-- than the old value when that is not below it. A node's view of a stamp
-- only rises, so a value that went back would hide the next changes.
--
-- KEYS[1]  the tenant's stamps: a hash, one field per kind (engine.StampKind)
-- ARGV[1]  the kind's field
--
-- Reply: the new value, a decimal string (microseconds since the epoch are
-- above what a Lua number holds exactly only past the year 2255; a string
-- keeps the reply free of floats all the same).
local key = KEYS[1]
local field = ARGV[1]

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local old = tonumber(redis.call('HGET', key, field) or '0') or 0
local new = now
if old >= now then
  new = old + 1
end
local s = string.format('%.0f', new)
redis.call('HSET', key, field, s)
return s
