-- reserve.lua holds the estimated cost of a job (engine.ReserveCommand):
-- it prices the estimated units, refuses when the effective balance
-- (balance - reserved - pending) is below that cost, else raises the
-- account's reserved total, stores the reservation in the account hash
-- (field "r:<id>", prelude encoding), adds it to the partition reservation-expiry
-- zset, writes one zero-delta "reservation" entry (ref = reservation id)
-- and appends the Mutation (kind "reserve", with the res section).
--
-- KEYS[1]  account hash               {prefix:pNN}:a:<customer>
-- KEYS[2]  partition outbox           {prefix:pNN}:outbox
-- KEYS[3]  partition reservation-expiry zset {prefix:pNN}:rexp
-- KEYS[4]  op key, only with an idempotency key
-- ARGV[1..8] as grant.lua             ARGV[9]  context JSON text or ""
-- ARGV[10] reservation id             ARGV[11] metric key
-- ARGV[12] estimated units (>= 1)     ARGV[13] pricing terms
-- ARGV[14] expires_at ms (> now)      ARGV[15] metadata JSON text or ""
--
-- Reply: {"new"|"replay", mutation JSON}; errors NOSTATE, MISMATCH,
-- INSUFFICIENT, OVERFLOW, BADTERMS, TOOMANYRESERVATIONS (MAX_ACTIVE_RESERVATIONS active
-- already), BADARG (also for a reservation id the
-- customer already has). Nothing is written before every check has passed,
-- except the refusal record of a block customer's INSUFFICIENT.
local account_key, outbox_key, rexp_key, op_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local now = int_parse(ARGV[1])
local op_id, tenant, env, customer = ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local idem, request_hash, op_ttl_ms, ctx = ARGV[6], ARGV[7], ARGV[8], ARGV[9]
local res_id, metric, est_units, terms = ARGV[10], ARGV[11], m_parse(ARGV[12]), terms_cached(ARGV[13])
local expires, meta = int_parse(ARGV[14]), ARGV[15]

if not now or not est_units or not terms or not expires or expires <= now or res_id == '' or metric == '' then
  return redis.error_reply('BADARG now, reservation id, metric, units, terms or expires_at')
end

local a, stop = reserve_open(account_key, now, res_id, op_key, request_hash, seen_keys(KEYS, 5))
if not a then return stop end

local cost, err = price(terms, est_units)
if not cost then return redis.error_reply(err) end
local _, _, effective = acct_bal(a, now)
-- A reservation its estimated cost would take past a budget is refused, whatever
-- the balance; the budget counts the commit, not the reservation (docs/decisions.md
-- "Budgets").
local _, bud_over = budget_take(account_key, budgets_of(ctx, now), metric, cost, nil)
if bud_over then
  return budget_refuse(account_key, outbox_key, {op = op_id, kind = 'reserve', tenant = tenant, customer = customer,
    env = env, now = now, ctx = ctx, eb = effective}, a,
    usage_json(metric, est_units, cost, MONEY_ZERO, MONEY_ZERO, true, nil), bud_over)
end
-- Under block the reservation may lean on the credit line: the effective balance
-- may end at minus the line (block_line).
-- With scoped blocks the reservation must also fit what applies to its metric
-- (prelude scope_reserve_ok).
if not scope_reserve_ok(a, now, metric, effective, cost, block_line(ctx)) then
  -- A block customer refused for credit owes credit.exhausted (docs/spec/addendum.md §8):
  -- the refusal record consume.lua writes (usage.refused, no entries, the
  -- same version, no idempotency key); the account itself is untouched.
  if refuses(ctx) then
    refuse(outbox_key, {op = op_id, kind = 'reserve', tenant = tenant, customer = customer, env = env,
      now = now, ctx = ctx, eb = effective}, a, usage_json(metric, est_units, cost, MONEY_ZERO, MONEY_ZERO, true, nil))
  end
  return redis.error_reply('INSUFFICIENT the effective balance is smaller than the estimated cost')
end
local reserved = m_add(a.rs, cost)
if not m_fits(reserved) then return redis.error_reply('OVERFLOW the reserved balance would not fit in int64') end

local entries, changed = {}, {}
expire_due(a, now, entries, changed)
a.rs = reserved
local r = {id = res_id, status = 'active', est_units = est_units, est_cost = cost, expires = expires,
  created = now, released = MONEY_ZERO, metric = metric, meta = meta, final = nil, act_units = nil,
  act_cost = nil, items = nil, t = {}, k = {}}
-- Texts at hand (res_txt): the units and expires_at as Go sent them, now's.
res_set(r, 'est_units', arg_txt(ARGV[12]))
res_set(r, 'expires', arg_txt(ARGV[14]))
res_set(r, 'created', now_fmt(now))
res_put(a, r)
entries[#entries + 1] = entry_obj({role = 'main', delta_s = '0', type = 'reservation', metric = metric, ref = res_id})

a.v = a.v + 1
acct_commit(account_key, a, changed, now)
redis.call('ZADD', rexp_key, res_txt(r, 'expires', i_fmt), res_member(tenant, env, customer, res_id))
local json = mutation_json({op = op_id, kind = 'reserve', tenant = tenant, customer = customer, env = env,
  idem = idem, rh = request_hash, now = now, ctx = ctx, eb = effective, res = r},
  a, entries, changed)
publish(outbox_key, op_key, op_ttl_ms, json)
return {'new', json}
