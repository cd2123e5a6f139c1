-- reservation_note.lua appends a reservation notice to a tenant's change feed (issue 27):
-- a reservation create, commit or release moved a customer's reserved and
-- effective balance, which no event reports, so a client answering checks
-- from memory hears of it here. Not a money script: it runs after the
-- reservation's own script answered, and touches only the feed.
-- Trimming as in stamp.lua: entries trimmed off the front leave their last
-- id as the horizon (field "x" of the stamps hash).
--
-- KEYS[1]  the tenant's stamps hash (for the horizon)
-- KEYS[2]  the tenant's change feed, a stream (same hash tag)
-- ARGV[1]  the customer's id
-- ARGV[2]  the customer's environment
-- ARGV[3]  the most entries the feed keeps (an integer >= 1)
-- ARGV[4]  optional: the fleet's change feed wake channel (as in stamp.lua)
-- ARGV[5]  with ARGV[4]: the wake message
--
-- Reply: the new entry's id.
local stamps = KEYS[1]
local feed = KEYS[2]
local customer = ARGV[1]
local env = ARGV[2]
local feedCap = tonumber(ARGV[3])

local t = redis.call('TIME')
local now = string.format('%.0f', tonumber(t[1]) * 1000000 + tonumber(t[2]))
local id = redis.call('XADD', feed, '*', 'kind', 'h', 'stamp', now, 'customer', customer, 'env', env)
local n = redis.call('XLEN', feed)
if n > feedCap then
  local gone = redis.call('XRANGE', feed, '-', '+', 'COUNT', n - feedCap)
  for _, e in ipairs(gone) do
    redis.call('XDEL', feed, e[1])
  end
  redis.call('HSET', stamps, 'x', gone[#gone][1])
end
if ARGV[4] then
  redis.call('PUBLISH', ARGV[4], ARGV[5])
end
return id
