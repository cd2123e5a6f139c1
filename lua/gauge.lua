-- gauge.lua moves a gauge counter (engine.GaugeCommand), kept in the
-- account hash as field "g:<metric>" (decimal; absent means 0). An
-- increment past the cap is refused unless allowed; a decrement never
-- takes the count below zero. The Mutation (kind "gauge", with the gauge
-- section, no entries) bumps the account version.
--
-- KEYS[1]  account hash          KEYS[2] partition outbox
-- KEYS[3]  op key, only with an idempotency key
-- ARGV[1..8] as grant.lua        ARGV[9] context JSON text or ""
-- ARGV[10] metric key            ARGV[11] delta (non-zero; > 0 increments)
-- ARGV[12] cap                   ARGV[13] "1" when the cap may be passed
--
-- Reply: {"new"|"replay", mutation JSON}; errors NOSTATE, MISMATCH,
-- "GAUGECAP <current> <cap> <shortfall>", BELOWZERO, OVERFLOW, BADARG.
-- A refusal changes nothing.
local account_key, outbox_key, op_key = KEYS[1], KEYS[2], KEYS[3]
local now = int_parse(ARGV[1])
local op_id, tenant, env, customer = ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local idem, request_hash, op_ttl_ms, ctx = ARGV[6], ARGV[7], ARGV[8], ARGV[9]
local metric, delta, cap, allow = ARGV[10], m_parse(ARGV[11]), m_parse(ARGV[12]), ARGV[13] == '1'

if not now or not delta or not cap or metric == '' or m_cmp(delta, MONEY_ZERO) == 0 then
  return redis.error_reply('BADARG now, metric, delta or cap')
end

local a = acct_read(account_key, now, {'g:' .. metric})
if not a then return redis.error_reply('NOSTATE no credit state for the customer') end
local rp = replay(op_key, request_hash)
if rp then return rp end

local cur = MONEY_ZERO
local stored = a.x['g:' .. metric]
if stored then cur = m_parse(stored) or MONEY_ZERO end
local new = m_add(cur, delta)
if not m_fits(new) then return redis.error_reply('OVERFLOW the gauge would not fit in int64') end
if m_pos(delta) and not allow and m_cmp(new, cap) > 0 then
  return redis.error_reply('GAUGECAP ' .. m_fmt(cur) .. ' ' .. m_fmt(cap) .. ' ' .. m_fmt(m_sub(new, cap)))
end
if m_cmp(new, MONEY_ZERO) < 0 then
  return redis.error_reply('BELOWZERO the decrement is larger than the current count')
end

local _, _, effective = acct_bal(a, now)
a.v = a.v + 1
acct_commit(account_key, a, {}, now)
redis.call('HSET', account_key, 'g:' .. metric, m_fmt(new))
local json = mutation_json({op = op_id, kind = 'gauge', tenant = tenant, customer = customer, env = env,
  idem = idem, rh = request_hash, now = now, ctx = ctx, eb = effective,
  extra = ',"gauge":{"metric":' .. j_str(metric) .. ',"current":' .. m_fmt(new) .. '}'}, a, {}, {})
publish(outbox_key, op_key, op_ttl_ms, json)
return {'new', json}
