-- gauge.lua moves a gauge counter (engine.GaugeCommand), kept in the
-- account hash as field "g:<metric>" (decimal; absent means 0). An
-- increment past the cap is refused unless allowed; a decrement never
-- takes the count below zero, nor below the slots active leases hold
-- (LEASED: those return by release or expiry). An increment may take a
-- lease on its slots (prelude "Gauge leases"): they return by themselves
-- at its expires unless renewed (lease.lua). Leases past their expires
-- are lapsed first, so the cap sees the count at now. The Mutation (kind
-- "gauge", with the gauge section, its cap and the leases it opened or
-- lapsed, no entries) bumps the account version.
--
-- KEYS[1]  account hash          KEYS[2] partition outbox
-- KEYS[3]  op key, only with an idempotency key
-- ARGV[1..8] as grant.lua        ARGV[9] context JSON text or ""
-- ARGV[10] metric key            ARGV[11] delta (non-zero; > 0 increments)
-- ARGV[12] cap                   ARGV[13] "1" when the cap may be passed
-- ARGV[14] lease id, "" or absent for none (increments only)
-- ARGV[15] lease length in seconds (>= 1, with a lease id)
--
-- Reply: {"new"|"replay", mutation JSON}; errors NOSTATE, MISMATCH,
-- "GAUGECAP <current> <cap> <shortfall>", BELOWZERO, LEASED, OVERFLOW,
-- TOOMANYLEASES, BADARG. A refusal changes nothing.
local account_key, outbox_key, op_key = KEYS[1], KEYS[2], KEYS[3]
local now = int_parse(ARGV[1])
local op_id, tenant, env, customer = ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local idem, request_hash, op_ttl_ms, ctx = ARGV[6], ARGV[7], ARGV[8], ARGV[9]
local metric, delta, cap, allow = ARGV[10], m_parse(ARGV[11]), m_parse(ARGV[12]), ARGV[13] == '1'
local lease_id, lease_s = ARGV[14] or '', int_parse(ARGV[15] or '')

if not now or not delta or not cap or metric == '' or m_cmp(delta, MONEY_ZERO) == 0 then
  return redis.error_reply('BADARG now, metric, delta or cap')
end
if lease_id ~= '' and (not m_pos(delta) or not lease_s or lease_s < 1 or string.find(lease_id, '[, ]')) then
  return redis.error_reply('BADARG a lease needs an increment, an id and a length >= 1 s')
end

local g_field, l_field = 'g:' .. metric, 'L:' .. metric
local a = acct_read(account_key, now, {g_field, l_field})
if not a then return redis.error_reply('NOSTATE no credit state for the customer') end
local rp = replay(op_key, request_hash, seen_keys(KEYS, 4))
if rp then return rp end

local cur = MONEY_ZERO
local stored = a.x[g_field]
if stored then cur = m_parse(stored) or MONEY_ZERO end
-- Leases past their expires hold nothing: their slots return now.
local active, due, held = leases_split(leases_dec(a.x[l_field]), now)
local lease_parts = {}
for _, l in ipairs(due) do
  cur = m_sub(cur, l.amount)
  lease_parts[#lease_parts + 1] = lease_json(l, 'expired', l.expires)
end
if m_cmp(cur, MONEY_ZERO) < 0 then cur = MONEY_ZERO end

local new = m_add(cur, delta)
if not m_fits(new) then return redis.error_reply('OVERFLOW the gauge would not fit in int64') end
if m_pos(delta) and not allow and m_cmp(new, cap) > 0 then
  return redis.error_reply('GAUGECAP ' .. m_fmt(cur) .. ' ' .. m_fmt(cap) .. ' ' .. m_fmt(m_sub(new, cap)))
end
if m_cmp(new, MONEY_ZERO) < 0 then
  return redis.error_reply('BELOWZERO the decrement is larger than the current count')
end
if not m_pos(delta) and m_cmp(new, held) < 0 then
  return redis.error_reply('LEASED the decrement would free slots that active leases hold')
end
if lease_id ~= '' then
  if #active >= MAX_GAUGE_LEASES then
    return redis.error_reply('TOOMANYLEASES the gauge has ' .. MAX_GAUGE_LEASES .. ' active leases')
  end
  for _, l in ipairs(active) do
    if l.id == lease_id then return redis.error_reply('BADARG the lease id is taken') end
  end
  local l = {id = lease_id, amount = delta, expires = now + lease_s * 1000, created = now, seconds = lease_s}
  active[#active + 1] = l
  lease_parts[#lease_parts + 1] = lease_json(l, 'active', nil)
end

local _, _, effective = acct_bal(a, now)
a.v = a.v + 1
acct_commit(account_key, a, {}, now)
gauge_write(account_key, metric, new, active, a.x[l_field] ~= nil)
local json = mutation_json({op = op_id, kind = 'gauge', tenant = tenant, customer = customer, env = env,
  idem = idem, rh = request_hash, now = now, ctx = ctx, eb = effective,
  extra = gauge_json(metric, new, lease_parts, arg_txt(ARGV[12]) or m_fmt(cap))}, a, {}, {})
publish(outbox_key, op_key, op_ttl_ms, json)
return {'new', json}
