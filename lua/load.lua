-- load.lua installs one customer's state rebuilt from Postgres, fenced by
-- version (invariant 5): a hash already at this or a newer version is left
-- alone, so a stale rebuild never overwrites newer state. A state of version
-- 0 without an account id ("customer known, no account") therefore only
-- creates a missing hash.
--
-- KEYS[1]   account hash               {prefix:pNN}:a:<customer>
-- KEYS[2]   partition expiry zset      {prefix:pNN}:exp
-- KEYS[3]   partition hold-expiry zset {prefix:pNN}:rexp
-- KEYS[4..] op keys of the recently applied mutations, one per op
-- ARGV[1]  tenant id       ARGV[2] environment     ARGV[3] customer id
-- ARGV[4]  account id ("") ARGV[5] version         ARGV[6] reserved
-- ARGV[7]  lifetime earned ARGV[8] updated_at ms   ARGV[9] block count n
-- then 9 values per block: id, remaining, original, priority, starts ms,
--   expires ms or "", created ms, source, metadata JSON text or ""
-- then 2 values per op key: TTL ms, mutation JSON
-- then the reservation count, and 11 values per reservation: id, status,
--   estimated units, estimated cost, expires ms, created ms, finalized ms
--   ("" while active), actual units (""), actual cost (""), released,
--   metric; then its metadata JSON text or "" (12 values in all)
-- then the gauge count, and 2 values per gauge: metric, count
--
-- Reply: 1 when the state was written, 0 when the fence kept the hash.
local account_key, expiry_key, rexp_key = KEYS[1], KEYS[2], KEYS[3]
local tenant, env, customer, account_id = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local version, reserved, earned = int_parse(ARGV[5]), m_parse(ARGV[6]), m_parse(ARGV[7])
local updated_ms, n = int_parse(ARGV[8]), int_parse(ARGV[9])

if not version or not reserved or not earned or not updated_ms or not n then
  return redis.error_reply('BADARG account fields')
end

local current = redis.call('HGET', account_key, 'v')
if current and tonumber(current) >= version then return 0 end

-- Parse everything before the first write, so bad input changes nothing.
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

local ops = #KEYS - 3
local o = 9 + n * 9 + ops * 2
local nres = int_parse(ARGV[o + 1])
if not nres then return redis.error_reply('BADARG reservation count') end
o = o + 1
local holds = {}
for i = 1, nres do
  local p = o + (i - 1) * 12
  local opt = function(s) if s == '' then return nil end return m_parse(s) end
  local r = {id = ARGV[p + 1], status = ARGV[p + 2], est_units = m_parse(ARGV[p + 3]), est_cost = m_parse(ARGV[p + 4]),
    expires = int_parse(ARGV[p + 5]), created = int_parse(ARGV[p + 6]), final = int_parse(ARGV[p + 7]),
    act_units = opt(ARGV[p + 8]), act_cost = opt(ARGV[p + 9]), released = m_parse(ARGV[p + 10]),
    metric = ARGV[p + 11], meta = ARGV[p + 12]}
  if not RES_CODE[r.status] or not r.est_units or not r.est_cost or not r.expires or not r.created or
      not r.released or (r.status ~= 'active' and not r.final) or string.find(r.metric, '|', 1, true) or
      (ARGV[p + 8] ~= '' and not r.act_units) or (ARGV[p + 9] ~= '' and not r.act_cost) then
    return redis.error_reply('BADARG reservation ' .. tostring(r.id))
  end
  if r.status == 'active' then r.final = nil end
  holds[#holds + 1] = r
end
o = o + nres * 12
local ngauges = int_parse(ARGV[o + 1])
if not ngauges then return redis.error_reply('BADARG gauge count') end
local gauges = {}
for i = 1, ngauges do
  local metric, count = ARGV[o + 2 * i], m_parse(ARGV[o + 2 * i + 1])
  if not count or metric == '' then return redis.error_reply('BADARG gauge ' .. tostring(metric)) end
  gauges[#gauges + 1] = {metric, count}
end

redis.call('DEL', account_key)
redis.call('HSET', account_key, 'id', account_id, 't', tenant, 'e', env, 'v', i_fmt(version),
  'rs', m_fmt(reserved), 'le', m_fmt(earned), 'ua', i_fmt(updated_ms))
for _, b in ipairs(blocks) do
  if m_pos(b.rem) then
    redis.call('HSET', account_key, 'b:' .. b.id, block_enc(b))
    if b.meta ~= '' then redis.call('HSET', account_key, 'm:' .. b.id, b.meta) end
  end
end
zset_sync(expiry_key, tenant .. '|' .. env .. '|' .. customer, blocks)
for _, r in ipairs(holds) do
  redis.call('HSET', account_key, 'r:' .. r.id, res_enc(r))
  if r.meta ~= '' then redis.call('HSET', account_key, 'n:' .. r.id, r.meta) end
  if r.status == 'active' then
    redis.call('ZADD', rexp_key, i_fmt(r.expires), res_member(tenant, env, customer, r.id))
  end
end
for _, g in ipairs(gauges) do redis.call('HSET', account_key, 'g:' .. g[1], m_fmt(g[2])) end

o = 9 + n * 9
for i = 4, #KEYS do
  local j = o + (i - 4) * 2
  redis.call('SET', KEYS[i], ARGV[j + 2], 'PX', ARGV[j + 1])
end
return 1
