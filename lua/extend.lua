-- extend.lua tops an active single-metric reservation up and/or prolongs it
-- (engine.ExtendCommand). A top-up prices the additional units as a
-- reservation of that many units would be, refuses like reserve.lua when
-- the effective balance is below that cost (a block customer's refusal
-- record for credit.exhausted included), else raises the account's
-- reserved total and the reservation's estimated units and cost. A new expiry
-- never comes before the current one; the reservation-expiry zset follows it.
-- One zero-delta "reservation" entry (ref = reservation id), as the
-- reserve wrote; the Mutation is kind "reserve", so the persister upserts
-- the reservation and events fire as for a reserve (credit.low_balance,
-- credit.exhausted).
--
-- KEYS[1..4] as reserve.lua           ARGV[1..9] as reserve.lua
-- ARGV[10] reservation id             ARGV[11] additional units ("0": none)
-- ARGV[12] pricing terms ("" with 0 units)
-- ARGV[13] new expires_at ms ("0": unchanged)
--
-- Reply: {"new"|"replay", mutation JSON}; errors NOSTATE, MISMATCH,
-- NOTFOUND, NOTACTIVE, EXPIRED (expires_at reached, not yet swept),
-- INSUFFICIENT, OVERFLOW, BADTERMS, SHORTER (the new expiry is before the
-- current one), BADARG (also for a multi-metric reservation). Nothing is written
-- before every check has passed, except the refusal record.
local account_key, outbox_key, rexp_key, op_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local now = int_parse(ARGV[1])
local op_id, tenant, env, customer = ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local idem, request_hash, op_ttl_ms, ctx = ARGV[6], ARGV[7], ARGV[8], ARGV[9]
local res_id, add_units, terms_arg, expires = ARGV[10], m_parse(ARGV[11]), ARGV[12], int_parse(ARGV[13])

if not now or not add_units or m_cmp(add_units, MONEY_ZERO) < 0 or not expires or expires < 0 or res_id == '' or
    (not m_pos(add_units) and expires == 0) then
  return redis.error_reply('BADARG now, reservation id, additional units or expires_at')
end

local a, r, reply = commit_open(account_key, now, res_id, false, op_key, request_hash, seen_keys(KEYS, 5))
if reply then return reply end
-- A multi-metric reservation's estimate is its items' (reserve_multi.lua), which
-- Redis does not store.
if r.metric == '' then return redis.error_reply('BADARG the reservation holds several metrics') end
if expires ~= 0 and expires < r.expires then return redis.error_reply('SHORTER the new expires_at is before the current one') end

local _, _, effective = acct_bal(a, now)
local cost = MONEY_ZERO
if m_pos(add_units) then
  local bad
  cost, bad = price_terms(terms_arg, add_units)
  if not cost then return bad end
  -- As reserve.lua: the reservation's new estimate may not take a budget past
  -- its limit.
  local _, bud_over = budget_take(account_key, budgets_of(ctx, now), r.metric, m_add(r.est_cost, cost), nil)
  if bud_over then
    return budget_refuse(account_key, outbox_key, {op = op_id, kind = 'reserve', tenant = tenant, customer = customer,
      env = env, now = now, ctx = ctx, eb = effective}, a,
      usage_json(r.metric, add_units, cost, MONEY_ZERO, MONEY_ZERO, true, nil), bud_over)
  end
  -- As reserve.lua: under block the top-up may lean on the credit line.
  if not scope_reserve_ok(a, now, r.metric, effective, cost, block_line(ctx)) then
    if refuses(ctx) then
      refuse(outbox_key, {op = op_id, kind = 'reserve', tenant = tenant, customer = customer, env = env,
        now = now, ctx = ctx, eb = effective}, a, usage_json(r.metric, add_units, cost, MONEY_ZERO, MONEY_ZERO, true, nil))
    end
    return redis.error_reply('INSUFFICIENT the effective balance is smaller than the additional cost')
  end
end
local reserved, est_units, est_cost = m_add(a.rs, cost), m_add(r.est_units, add_units), m_add(r.est_cost, cost)
if not m_fits(reserved) or not m_fits(est_units) or not m_fits(est_cost) then
  return redis.error_reply('OVERFLOW the estimate or the reserved balance would not fit in int64')
end

local entries, changed = {}, {}
expire_due(a, now, entries, changed)
a.rs = reserved
r.est_units, r.est_cost = est_units, est_cost
if expires ~= 0 then
  r.expires = expires
  res_set(r, 'expires', arg_txt(ARGV[13]))
end
res_update(a, r)
entries[#entries + 1] = entry_obj({role = 'main', delta_s = '0', type = 'reservation', metric = r.metric, ref = res_id})

a.v = a.v + 1
acct_commit(account_key, a, changed, now)
if expires ~= 0 then
  redis.call('ZADD', rexp_key, res_txt(r, 'expires', i_fmt), res_member(tenant, env, customer, res_id))
end
local json = mutation_json({op = op_id, kind = 'reserve', tenant = tenant, customer = customer, env = env,
  idem = idem, rh = request_hash, now = now, ctx = ctx, eb = effective, res = r},
  a, entries, changed)
publish(outbox_key, op_key, op_ttl_ms, json)
return {'new', json}
