-- lease.lua renews, releases or expires one lease of a gauge
-- (engine.LeaseCommand; prelude "Gauge leases"). Every lease of the gauge
-- past its expires lapses on the way (status expired, ended at its
-- expires), as in gauge.lua. renew moves the lease's expires to now plus
-- its length (the new one when given); release returns its slots now
-- (status released); expire (the sweep) only writes down the lapse of a
-- lease already due. The Mutation is kind "gauge" with the leases it
-- touched; there are no ledger entries.
--
-- KEYS[1]  account hash          KEYS[2] partition outbox
-- KEYS[3]  op key, only with an idempotency key
-- ARGV[1..8] as grant.lua        ARGV[9] context JSON text or ""
-- ARGV[10] metric key            ARGV[11] lease id
-- ARGV[12] action: renew, release or expire
-- ARGV[13] renew length in seconds, "" for the lease's own
--
-- Reply: {"new"|"replay", mutation JSON}; errors NOSTATE, MISMATCH,
-- LEASENOTFOUND (the hash holds no such lease of the gauge, active or
-- due: it ended and was written down, or never was), LEASEENDED (renew of
-- a lease already due), LEASENOTDUE (expire before expires), BADARG. A
-- refusal changes nothing.
local account_key, outbox_key, op_key = KEYS[1], KEYS[2], KEYS[3]
local now = int_parse(ARGV[1])
local op_id, tenant, env, customer = ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local idem, request_hash, op_ttl_ms, ctx = ARGV[6], ARGV[7], ARGV[8], ARGV[9]
local metric, lease_id, action, renew_s = ARGV[10], ARGV[11], ARGV[12], int_parse(ARGV[13] or '')

if not now or metric == '' or lease_id == '' or
    (action ~= 'renew' and action ~= 'release' and action ~= 'expire') or (renew_s and renew_s < 1) then
  return redis.error_reply('BADARG now, metric, lease id, action or length')
end

local g_field, l_field = 'g:' .. metric, 'L:' .. metric
local a = acct_read(account_key, now, {g_field, l_field})
if not a then return redis.error_reply('NOSTATE no credit state for the customer') end
local rp = replay(op_key, request_hash, seen_keys(KEYS, 4))
if rp then return rp end

local active, due = leases_split(leases_dec(a.x[l_field]), now)
local target, at, target_due = nil, nil, false
for i, l in ipairs(active) do
  if l.id == lease_id then target, at = l, i end
end
if not target then
  for _, l in ipairs(due) do
    if l.id == lease_id then target, target_due = l, true end
  end
end
if not target then return redis.error_reply('LEASENOTFOUND no such lease of the gauge') end
if action == 'renew' and target_due then return redis.error_reply('LEASEENDED the lease ended') end
if action == 'expire' and not target_due then return redis.error_reply('LEASENOTDUE the lease is active') end

local cur = MONEY_ZERO
if a.x[g_field] then cur = m_parse(a.x[g_field]) or MONEY_ZERO end
local parts = {}
for _, l in ipairs(due) do
  cur = m_sub(cur, l.amount)
  parts[#parts + 1] = lease_json(l, 'expired', l.expires)
end
if action == 'renew' then
  local s = renew_s or target.seconds
  target.expires, target.seconds = now + s * 1000, s
  parts[#parts + 1] = lease_json(target, 'active', nil)
elseif action == 'release' and not target_due then
  table.remove(active, at)
  cur = m_sub(cur, target.amount)
  parts[#parts + 1] = lease_json(target, 'released', now)
end
if m_cmp(cur, MONEY_ZERO) < 0 then cur = MONEY_ZERO end

local _, _, effective = acct_bal(a, now)
a.v = a.v + 1
acct_commit(account_key, a, {}, now)
gauge_write(account_key, metric, cur, active, a.x[l_field] ~= nil)
local json = mutation_json({op = op_id, kind = 'gauge', tenant = tenant, customer = customer, env = env,
  idem = idem, rh = request_hash, now = now, ctx = ctx, eb = effective,
  extra = gauge_json(metric, cur, parts)}, a, {}, {})
publish(outbox_key, op_key, op_ttl_ms, json)
return {'new', json}
