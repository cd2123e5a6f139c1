-- load.lua installs the states of several customers of one partition,
-- rebuilt from Postgres, in one call: the prelude's top level runs once per
-- batch, not once per account, which is what bound a rebuild of a million
-- accounts. Each account is fenced by version on its own (invariant 5): a
-- hash already at this or a newer version is left alone, so a stale load
-- never overwrites newer state. A state of version 0 without an account id
-- ("customer known, no account") therefore only creates a missing hash.
--
-- KEYS[1]   partition expiry zset      {prefix:pNN}:exp
-- KEYS[2]   partition hold-expiry zset {prefix:pNN}:rexp
-- then per account: its hash {prefix:pNN}:a:<customer>, then the op keys
--   of its recently applied mutations, one per op
-- ARGV[1]   account count
-- then per account:
--   op key count k, tenant id, environment, customer id, account id (""),
--   version, reserved, lifetime earned, updated_at ms, block count n
--   then 9 values per block: id, remaining, original, priority, starts ms,
--     expires ms or "", created ms, source, metadata JSON text or ""
--   then 2 values per op key: TTL ms, mutation JSON
--   then the reservation count, and 12 values per reservation: id, status,
--     estimated units, estimated cost, expires ms, created ms, finalized ms
--     ("" while active), actual units (""), actual cost (""), released,
--     metric, metadata JSON text or ""
--   then the gauge count, and 2 values per gauge: metric, count
--
-- Every account is parsed before the first write, so bad input anywhere in
-- the batch changes nothing. Reply: one integer per account, 1 when its
-- state was written, 0 when the fence kept its hash.
local expiry_key, rexp_key = KEYS[1], KEYS[2]
local count = int_parse(ARGV[1])
if not count then return redis.error_reply('BADARG account count') end

local function opt(s) if s == '' then return nil end return m_parse(s) end

local accounts = {}
local o, k = 1, 2
for _ = 1, count do
  local ops = int_parse(ARGV[o + 1])
  local a = {key = KEYS[k + 1], tenant = ARGV[o + 2], env = ARGV[o + 3], customer = ARGV[o + 4],
    id = ARGV[o + 5], version = int_parse(ARGV[o + 6]), reserved = m_parse(ARGV[o + 7]),
    earned = m_parse(ARGV[o + 8]), updated = int_parse(ARGV[o + 9])}
  local n = int_parse(ARGV[o + 10])
  if not ops or not a.key or not a.version or not a.reserved or not a.earned or not a.updated or not n then
    return redis.error_reply('BADARG account fields ' .. tostring(a.customer))
  end
  o = o + 10
  a.blocks = {}
  for i = 1, n do
    local b = {id = ARGV[o + 1], rem = m_parse(ARGV[o + 2]), orig = m_parse(ARGV[o + 3]),
      prio = int_parse(ARGV[o + 4]), starts = int_parse(ARGV[o + 5]), expires = int_parse(ARGV[o + 6]),
      created = int_parse(ARGV[o + 7]), src = ARGV[o + 8], meta = ARGV[o + 9]}
    if not b.rem or not b.orig or not b.prio or not b.starts or not b.created or
        (ARGV[o + 6] ~= '' and not b.expires) then
      return redis.error_reply('BADARG block ' .. tostring(b.id))
    end
    a.blocks[i] = b
    o = o + 9
  end
  a.ops = {}
  for i = 1, ops do
    local ttl = int_parse(ARGV[o + 1])
    if not ttl or not KEYS[k + 1 + i] then return redis.error_reply('BADARG op key of ' .. a.customer) end
    a.ops[i] = {KEYS[k + 1 + i], ARGV[o + 1], ARGV[o + 2]}
    o = o + 2
  end
  k = k + 1 + ops
  local nres = int_parse(ARGV[o + 1])
  if not nres then return redis.error_reply('BADARG reservation count') end
  o = o + 1
  a.holds = {}
  for i = 1, nres do
    local r = {id = ARGV[o + 1], status = ARGV[o + 2], est_units = m_parse(ARGV[o + 3]), est_cost = m_parse(ARGV[o + 4]),
      expires = int_parse(ARGV[o + 5]), created = int_parse(ARGV[o + 6]), final = int_parse(ARGV[o + 7]),
      act_units = opt(ARGV[o + 8]), act_cost = opt(ARGV[o + 9]), released = m_parse(ARGV[o + 10]),
      metric = ARGV[o + 11], meta = ARGV[o + 12]}
    if not RES_CODE[r.status] or not r.est_units or not r.est_cost or not r.expires or not r.created or
        not r.released or (r.status ~= 'active' and not r.final) or string.find(r.metric, '|', 1, true) or
        (ARGV[o + 8] ~= '' and not r.act_units) or (ARGV[o + 9] ~= '' and not r.act_cost) then
      return redis.error_reply('BADARG reservation ' .. tostring(r.id))
    end
    if r.status == 'active' then r.final = nil end
    a.holds[i] = r
    o = o + 12
  end
  local ngauges = int_parse(ARGV[o + 1])
  if not ngauges then return redis.error_reply('BADARG gauge count') end
  o = o + 1
  a.gauges = {}
  for i = 1, ngauges do
    local metric, n = ARGV[o + 1], m_parse(ARGV[o + 2])
    if not n or metric == '' then return redis.error_reply('BADARG gauge ' .. tostring(metric)) end
    a.gauges[i] = {metric, n}
    o = o + 2
  end
  accounts[#accounts + 1] = a
end
if ARGV[o + 1] ~= nil or KEYS[k + 1] ~= nil then return redis.error_reply('BADARG trailing values') end

local reply = {}
for i, a in ipairs(accounts) do
  local current = redis.call('HGET', a.key, 'v')
  if current and tonumber(current) >= a.version then
    reply[i] = 0
  else
    -- The whole hash in one HSET: account fields, then blocks with credit,
    -- holds and gauges, each metadata in its own field.
    local f = {'id', a.id, 't', a.tenant, 'e', a.env, 'v', i_fmt(a.version), 'rs', m_fmt(a.reserved),
      'le', m_fmt(a.earned), 'ua', i_fmt(a.updated)}
    for _, b in ipairs(a.blocks) do
      if m_pos(b.rem) then
        f[#f + 1] = 'b:' .. b.id
        f[#f + 1] = block_enc(b)
        if b.meta ~= '' then f[#f + 1] = 'm:' .. b.id; f[#f + 1] = b.meta end
      end
    end
    local member = a.tenant .. '|' .. a.env .. '|' .. a.customer
    for _, r in ipairs(a.holds) do
      f[#f + 1] = 'r:' .. r.id
      f[#f + 1] = res_enc(r)
      if r.meta ~= '' then f[#f + 1] = 'n:' .. r.id; f[#f + 1] = r.meta end
      if r.status == 'active' then
        redis.call('ZADD', rexp_key, i_fmt(r.expires), res_member(a.tenant, a.env, a.customer, r.id))
      end
    end
    for _, g in ipairs(a.gauges) do f[#f + 1] = 'g:' .. g[1]; f[#f + 1] = m_fmt(g[2]) end
    redis.call('DEL', a.key)
    -- unpack is bounded by Lua's C stack: a hash of many gauges goes in parts.
    for from = 1, #f, 1000 do redis.call('HSET', a.key, unpack(f, from, math.min(from + 999, #f))) end
    zset_sync(expiry_key, member, a.blocks)
    for _, op in ipairs(a.ops) do redis.call('SET', op[1], op[3], 'PX', op[2]) end
    reply[i] = 1
  end
end
return reply
