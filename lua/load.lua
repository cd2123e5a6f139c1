-- load.lua installs one customer's state rebuilt from Postgres, fenced by
-- version (invariant 5): a hash already at this or a newer version is left
-- alone, so a stale rebuild never overwrites newer state. A state of version
-- 0 without an account id ("customer known, no account") therefore only
-- creates a missing hash.
--
-- KEYS[1]   account hash          {prefix:pNN}:a:<customer>
-- KEYS[2]   partition expiry zset {prefix:pNN}:exp
-- KEYS[3..] op keys of the recently applied mutations, one per op
-- ARGV[1]  tenant id       ARGV[2] environment     ARGV[3] customer id
-- ARGV[4]  account id ("") ARGV[5] version         ARGV[6] reserved
-- ARGV[7]  lifetime earned ARGV[8] updated_at ms   ARGV[9] block count n
-- then 9 values per block: id, remaining, original, priority, starts ms,
--   expires ms or "", created ms, source, metadata JSON text or ""
-- then 2 values per op key: TTL ms, mutation JSON
--
-- Reply: 1 when the state was written, 0 when the fence kept the hash.
local account_key, expiry_key = KEYS[1], KEYS[2]
local tenant, env, customer, account_id = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local version, reserved, earned = int_parse(ARGV[5]), m_parse(ARGV[6]), m_parse(ARGV[7])
local updated_ms, n = int_parse(ARGV[8]), int_parse(ARGV[9])

if not version or not reserved or not earned or not updated_ms or not n then
  return redis.error_reply('BADARG account fields')
end

local current = redis.call('HGET', account_key, 'v')
if current and tonumber(current) >= version then return 0 end

-- Parse every block before the first write, so bad input changes nothing.
local blocks = {}
for i = 1, n do
  local o = 9 + (i - 1) * 9
  local b = {id = ARGV[o + 1], rem = m_parse(ARGV[o + 2]), orig = m_parse(ARGV[o + 3]),
    prio = int_parse(ARGV[o + 4]), starts = int_parse(ARGV[o + 5]), expires = int_parse(ARGV[o + 6]),
    created = int_parse(ARGV[o + 7]), src = ARGV[o + 8], meta = ARGV[o + 9]}
  if not b.rem or not b.orig or not b.prio or not b.starts or not b.created or
      (ARGV[o + 6] ~= '' and not b.expires) then
    return redis.error_reply('BADARG block ' .. tostring(b.id))
  end
  blocks[#blocks + 1] = b
end

redis.call('DEL', account_key)
redis.call('HSET', account_key, 'id', account_id, 't', tenant, 'e', env, 'v', i_fmt(version),
  'rs', m_fmt(reserved), 'le', m_fmt(earned), 'ua', i_fmt(updated_ms))
for _, b in ipairs(blocks) do
  if m_pos(b.rem) then redis.call('HSET', account_key, 'b:' .. b.id, block_enc(b)) end
end
zset_sync(expiry_key, tenant .. '|' .. env .. '|' .. customer, blocks)

local o = 9 + n * 9
for i = 3, #KEYS do
  local j = o + (i - 3) * 2
  redis.call('SET', KEYS[i], ARGV[j + 2], 'PX', ARGV[j + 1])
end
return 1
