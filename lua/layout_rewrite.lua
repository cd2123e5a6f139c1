-- layout_rewrite.lua writes the rewrite of one account hash from a layout
-- older than issue 10's compact one, which Go worked out from the fields it
-- read (layout_fence.go layoutPlan), only when none of the fields it read
-- changed since: a compare-and-set of the whole change in one script, so no
-- other script sees a hash half rewritten and no concurrent change is lost.
-- The request-path scripts read only the current layout (docs/decisions.md
-- "Legacy account layouts rewritten once (issue 29)").
--
-- KEYS[1]  the account hash
-- ARGV[1]  c, the number of fields checked; then c pairs field, value as
--          Go read it
-- then     d, the number of fields deleted; then their d names
-- then     the pairs field, value to set
-- Reply: 1 when written, 0 when a checked field changed (Go reads the hash
-- again).
local key = KEYS[1]
local c = tonumber(ARGV[1])
-- The checked fields are ARGV[2], ARGV[4], ... ARGV[2c], each followed by
-- its value: 500 a HMGET (unpack's limit).
for first = 2, 2 * c, 1000 do
  local names = {}
  for j = first, math.min(first + 998, 2 * c), 2 do names[#names + 1] = ARGV[j] end
  local got = redis.call('HMGET', key, unpack(names))
  for k, v in ipairs(got) do
    if v ~= ARGV[first + 2 * k - 1] then return 0 end
  end
end
local i = 2 * c + 2
local d = tonumber(ARGV[i])
i = i + 1
-- In slices under unpack's limit: an account keeps up to thousands of
-- blocks and reservations.
for first = i, i + d - 1, 1000 do redis.call('HDEL', key, unpack(ARGV, first, math.min(first + 999, i + d - 1))) end
i = i + d
for first = i, #ARGV, 1000 do redis.call('HSET', key, unpack(ARGV, first, math.min(first + 999, #ARGV))) end
return 1
