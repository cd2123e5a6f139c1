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
-- With KEYS[2] the bump is also appended to the tenant's change feed (issue
-- 27): a capped stream that GET /v1/changes/stream follows, so a client
-- caching checks hears of every change the stamps stand for. The entries
-- trimmed off the front are remembered as a horizon (field "x" of the
-- stamps hash): a reader resuming before it has missed changes and starts
-- over instead of believing it is current.
--
-- KEYS[1]  the tenant's stamps: a hash, one field per kind (engine.StampKind)
-- KEYS[2]  optional: the tenant's change feed, a stream (same hash tag)
-- ARGV[1]  the kind's field
-- ARGV[2]  with KEYS[2]: the feed's cap (an integer >= 1): it keeps at least
--          that many entries and at most a tenth more
-- ARGV[3]  optional, with KEYS[2]: the fleet's change feed wake channel
-- ARGV[4]  with ARGV[3]: the wake message (lua/wakes.go)
--
-- The wake is published here rather than by the caller after the reply:
-- it costs no round trip, and a node following the channel reads the feed
-- at once instead of at its next poll (a lost wake costs only that poll).
--
-- Reply: the new value, a decimal string (microseconds since the epoch are
-- above what a Lua number holds exactly only past the year 2255; a string
-- keeps the reply free of floats all the same).
local key = KEYS[1]
local feed = KEYS[2]
local field = ARGV[1]
local feedCap = tonumber(ARGV[2] or '0') or 0

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local old = tonumber(redis.call('HGET', key, field) or '0') or 0
local new = now
if old >= now then
  new = old + 1
end
local s = string.format('%.0f', new)
redis.call('HSET', key, field, s)

if feed and feedCap >= 1 then
  redis.call('XADD', feed, '*', 'kind', field, 'stamp', s)
  feed_trim(feed, key, feedCap)
  if ARGV[3] then
    redis.call('PUBLISH', ARGV[3], ARGV[4])
  end
end
return s
