-- reserve_multi.lua holds the summed estimated cost of several metrics
-- (engine.ReserveCommand with Items): every item or none. It is
-- reserve.lua for a list of items, kept apart so the single reserve runs
-- no item loop and stores its reservation exactly as before.
--
-- The reservation is one reservation: its metric is "" (the encoding's metric
-- field empty), its estimated units and cost the items' totals. The item
-- list travels in the Mutation (res.items: [{billable_metric_key,
-- estimated_units, estimated_cost}]) to Postgres (reservations.items) and
-- is not stored in Redis: a commit gets it from Postgres (engine
-- Reservations.Commit) and checks its totals against the reservation, so a reservation
-- rebuilt from Postgres commits the same. The "reservation" entry names no
-- metric.
--
-- KEYS as reserve.lua.
-- ARGV[1..9] as reserve.lua           ARGV[10] reservation id
-- ARGV[11] expires_at ms (> now)      ARGV[12] metadata JSON text or ""
-- ARGV[13] n, the number of items (1..20)
-- ARGV[14 + 3(i-1) ..] item i: metric key, estimated units (>= 1), pricing
--          terms (prelude terms_parse)
--
-- Reply: {"new"|"replay", mutation JSON}; errors as reserve.lua (OVERFLOW
-- also when the items' total units or cost leave int64).
local account_key, outbox_key, rexp_key, op_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local now = int_parse(ARGV[1])
local op_id, tenant, env, customer = ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local idem, request_hash, op_ttl_ms, ctx = ARGV[6], ARGV[7], ARGV[8], ARGV[9]
local res_id, expires, meta, n = ARGV[10], int_parse(ARGV[11]), ARGV[12], tonumber(ARGV[13])

if not now or not expires or expires <= now or res_id == '' or not n or n < 1 or n > 20 or #ARGV ~= 13 + 3 * n then
  return redis.error_reply('BADARG now, reservation id, expires_at or items')
end
local items = {}
for i = 1, n do
  local at = 13 + 3 * (i - 1)
  local metric, units, terms = ARGV[at + 1], m_parse(ARGV[at + 2]), terms_cached(ARGV[at + 3])
  if metric == '' or not units or not m_pos(units) or not terms then
    return redis.error_reply('BADARG item metric, units or terms')
  end
  items[i] = {metric = metric, units = units, terms = terms}
end

local a, stop = reserve_open(account_key, now, res_id, op_key, request_hash, seen_keys(KEYS, 5))
if not a then return stop end

local cost, units, items_j, bad = items_price(items, 'estimated_units', 'estimated_cost')
if bad then return bad end
local _, _, effective = acct_bal(a, now)
-- As reserve.lua: a reservation past a budget is refused.
local _, bud_over = budget_take(account_key, budgets_of(ctx, now), '', cost, items)
if bud_over then
  return budget_refuse(account_key, outbox_key, {op = op_id, kind = 'reserve', tenant = tenant, customer = customer,
    env = env, now = now, ctx = ctx, eb = effective}, a,
    usage_json('', units, cost, MONEY_ZERO, MONEY_ZERO, true, nil), bud_over)
end
-- With scoped blocks a multi-metric reservation is backed by unscoped ones (metric
-- "": prelude scope_reserve_ok).
if not scope_reserve_ok(a, now, '', effective, cost, block_line(ctx)) then
  -- As reserve.lua: a block customer's refusal record, for credit.exhausted
  -- (no metric: several were asked for, as consume_multi.lua's).
  if refuses(ctx) then
    refuse(outbox_key, {op = op_id, kind = 'reserve', tenant = tenant, customer = customer, env = env,
      now = now, ctx = ctx, eb = effective}, a, usage_json('', units, cost, MONEY_ZERO, MONEY_ZERO, true, nil))
  end
  return redis.error_reply('INSUFFICIENT the effective balance is smaller than the estimated cost')
end
local reserved = m_add(a.rs, cost)
if not m_fits(reserved) then return redis.error_reply('OVERFLOW the reserved balance would not fit in int64') end

local entries, changed = {}, {}
expire_due(a, now, entries, changed)
a.rs = reserved
local r = {id = res_id, status = 'active', est_units = units, est_cost = cost, expires = expires,
  created = now, released = MONEY_ZERO, metric = '', meta = meta, final = nil, act_units = nil,
  act_cost = nil, items = items_j, t = {}, k = {}}
-- Texts at hand (res_txt): expires_at as Go sent it, now's.
res_set(r, 'expires', arg_txt(ARGV[11]))
res_set(r, 'created', now_fmt(now))
res_put(a, r)
entries[#entries + 1] = entry_obj({role = 'main', delta_s = '0', type = 'reservation', ref = res_id})

a.v = a.v + 1
acct_commit(account_key, a, changed, now)
redis.call('ZADD', rexp_key, res_txt(r, 'expires', i_fmt), res_member(tenant, env, customer, res_id))
local json = mutation_json({op = op_id, kind = 'reserve', tenant = tenant, customer = customer, env = env,
  idem = idem, rh = request_hash, now = now, ctx = ctx, eb = effective, res = r},
  a, entries, changed)
publish(outbox_key, op_key, op_ttl_ms, json)
return {'new', json}
