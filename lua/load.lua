-- load.lua installs the states of several customers of one partition,
-- rebuilt from Postgres, in one call. Go prepares every hash field in the
-- encoding the prelude reads (lua/load.go: blocks, reservations, gauges, metadata
-- and the account fields), so the script only fences and writes: a rebuild
-- of a million accounts is bound by Redis running it. Each account is
-- fenced by version on its own (invariant 5): a hash already at this or a
-- newer version is left alone, so a stale load never overwrites newer
-- state. A state of version 0 without an account id ("customer known, no
-- account") therefore only creates a missing hash.
--
-- KEYS[1]   partition reservation-expiry zset {prefix:pNN}:rexp
-- then per account: its hash {prefix:pNN}:a:<customer>, then the op keys
--   of its recently applied mutations, one per op
-- ARGV[1]   account count
-- then per account:
--   version, op key count k, field count f (name and value pairs), active
--   reservation count h, expected version x ("" for the version fence; else see
--   below),
--   then h pairs: reservation-expiry zset score and member,
--   then f pairs: hash field name and value (the first is "v"),
--   then k pairs: op key TTL ms and mutation JSON
--
-- A reload (creditd reconcile --fix) replaces a hash that diverged from
-- Postgres, whatever its version: it passes the version x it compared, and
-- the hash is replaced only while it still holds x (-1: absent), so a
-- script that moved the account since is never overwritten (it is compared
-- again on the next pass).
--
-- Every account is checked before the first write, so malformed input
-- anywhere in the batch changes nothing. Reply: one integer per account, 1
-- when its state was written, 0 when the fence kept its hash.
local count = tonumber(ARGV[1])
if not count then return redis.error_reply('BADARG account count') end

local accounts = {}
local o, k = 1, 1
for i = 1, count do
  local version, ops, fields, reservations = tonumber(ARGV[o + 1]), tonumber(ARGV[o + 2]), tonumber(ARGV[o + 3]), tonumber(ARGV[o + 4])
  local expect = ARGV[o + 5]
  if not version or not ops or not fields or fields < 1 or not reservations or not KEYS[k + 1 + ops] or
      not expect or (expect ~= '' and not tonumber(expect)) then
    return redis.error_reply('BADARG account ' .. i)
  end
  local a = {key = KEYS[k + 1], version = version, expect = tonumber(expect),
    reservations = o + 5, fields = o + 5 + 2 * reservations, nfields = fields, ops = k + 1, nops = ops}
  a.opargs = a.fields + 2 * fields
  o = a.opargs + 2 * ops
  k = k + 1 + ops
  if ARGV[o] == nil then return redis.error_reply('BADARG account ' .. i .. ' is short') end
  accounts[i] = a
end
if ARGV[o + 1] ~= nil or KEYS[k + 1] ~= nil then return redis.error_reply('BADARG trailing values') end

local reply = {}
for i, a in ipairs(accounts) do
  local current = redis.call('HGET', a.key, 'v')
  local keep
  if a.expect then
    keep = (tonumber(current) or -1) ~= a.expect
  else
    keep = current and tonumber(current) >= a.version
  end
  if keep then
    reply[i] = 0
  else
    redis.call('DEL', a.key)
    -- unpack is bounded by Lua's C stack: a hash of many fields goes in parts.
    local from, last = a.fields + 1, a.fields + 2 * a.nfields
    while from <= last do
      local to = math.min(from + 999, last)
      redis.call('HSET', a.key, unpack(ARGV, from, to))
      from = to + 1
    end
    for j = a.reservations + 1, a.fields, 2 do redis.call('ZADD', KEYS[1], ARGV[j], ARGV[j + 1]) end
    for j = 0, a.nops - 1 do
      redis.call('SET', KEYS[a.ops + 1 + j], ARGV[a.opargs + 2 * j + 2], 'PX', ARGV[a.opargs + 2 * j + 1])
    end
    reply[i] = 1
  end
end
return reply
