-- consume.lua prices units of a metric and charges them in one step
-- (engine.ConsumeCommand), after expiring the blocks that are due, and
-- appends the Mutation (kind "consume", with a usage section) to the outbox.
--
-- Under policy block a cost above the effective balance (balance - reserved
-- - pending) plus the credit line (ctx "lim": line_split) changes nothing in
-- the account: the script only appends a
-- refusal record (usage.refused, no entries, the same version, no
-- idempotency key, so Postgres never takes it for an applied operation)
-- for credit.exhausted, and answers INSUFFICIENT. Under allow and notify
-- the charge is min(cost, max(effective, 0)) and the rest is overage.
--
-- Entries: ONE consumption entry (the spec's one debit) with the metric,
-- the units of the call and the overage: it names the block when one block
-- paid, else its block is null and its draws list what each block paid;
-- when nothing is drained (a zero cost, or no effective balance) it has a
-- zero delta and no block. Expiry entries of blocks that ran out come first.
--
-- KEYS[1]  account hash          {prefix:pNN}:a:<customer>
-- KEYS[2]  partition outbox      {prefix:pNN}:outbox
-- KEYS[3]  op key, only with an idempotency key {prefix:pNN}:op:<customer>:<hash>
-- ARGV[1..8] as grant.lua (now, op id, tenant, env, customer, idempotency
--          key JSON text, request hash, op key TTL ms)
-- ARGV[9]  engine.MutationContext JSON text or ""
-- ARGV[10] metric key             ARGV[11] units (decimal, >= 1)
-- ARGV[12] pricing terms (prelude terms_parse)
-- ARGV[13] policy: block, allow or notify
-- ARGV[14] entry metadata JSON text or ""
-- ARGV[15] the pool of a child customer (engine.PoolArg), "" or absent
--          without a parent; ARGV[16] the op id of the parent's Mutation
--          and ARGV[17] its context JSON text (engine.PoolDraw)
--
-- A child spends its own blocks, then its parent's within its draw limit,
-- then its credit line (prelude pool_split; docs/rules.md "Shared
-- pools"): the parent's part is the parent's own Mutation (prelude
-- pool_take), appended before the child's; the child's usage names it
-- (usage.pool) and its consumption entry debits the child's part only.
--
-- A customer's budgets (ctx "bud") count the cost; one the cost would take
-- past its limit refuses it under every policy (BUDGET, prelude
-- budget_refuse) before the balance is looked at.
--
-- Reply: {"new", mutation JSON} or {"replay", stored op record} (the
-- compact consume record, or a Mutation JSON a rebuild stored); errors
-- NOSTATE, MISMATCH, INSUFFICIENT (block), BUDGET, OVERFLOW (the cost
-- leaves int64), BADTERMS, BADARG.
local account_key, outbox_key, op_key = KEYS[1], KEYS[2], KEYS[3]
local now = int_parse(ARGV[1])
local op_id, tenant, env, customer = ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local idem, request_hash, op_ttl_ms, ctx = ARGV[6], ARGV[7], ARGV[8], ARGV[9]
local metric, units, terms, policy, entry_meta = ARGV[10], m_parse(ARGV[11]), terms_cached(ARGV[12]), ARGV[13], ARGV[14]
local pool_arg, pool_op, pool_ctx = ARGV[15] or '', ARGV[16] or '', ARGV[17] or ''

if not now or not units or not terms or metric == '' or
    (policy ~= 'block' and policy ~= 'allow' and policy ~= 'notify') then
  return redis.error_reply('BADARG now, metric, units, terms or policy')
end

-- The budgets' counters come with the account read (prelude
-- budget_fields) and go with its write (budget_count before acct_commit).
local buds = budgets_of(ctx, now)
local a = acct_read(account_key, now, budget_fields({'o'}, buds), false, true)
if not a then return redis.error_reply('NOSTATE no credit state for the customer') end
local r = replay(op_key, request_hash, seen_keys(KEYS, 4))
if r then return r end
local pool = pool_of(account_key, pool_arg, now)

local cost, err = price(terms, units)
if not cost then return redis.error_reply(err) end

local _, _, effective = acct_bal(a, now)
local m = {op = op_id, kind = 'consume', tenant = tenant, customer = customer, env = env,
  idem = idem, rh = request_hash, now = now, ctx = ctx, eb = effective}

-- A budget refuses a cost that would take it past its limit, whatever the
-- balance and the policy (prelude budget_take).
local bud_hits, bud_over = budget_take(account_key, buds, metric, cost, nil, a)
if bud_over then
  return budget_refuse(account_key, outbox_key, m, a,
    usage_json(metric, units, cost, MONEY_ZERO, MONEY_ZERO, true, nil), bud_over)
end

-- charge is what the blocks pay, debt what goes on the credit line.
local charge, debt = cost, MONEY_ZERO
local entries, changed, draws, pooled = {}, {}, nil, MONEY_ZERO
if pool then
  -- A child: its own blocks, then its parent's, then its line (prelude
  -- pool_fast on a scoped hash read on the fast path, else pool_split).
  if a.sc_fast then
    charge, debt, draws, pooled = pool_fast(a, pool, now, metric, effective, cost, line_of(ctx), policy == 'block', entries, changed)
  else
    charge, debt, pooled = pool_split(a, pool, now, metric, effective, cost, line_of(ctx), policy == 'block')
  end
  if debt == 'NOPOOLSTATE' then return redis.error_reply('NOPOOLSTATE no credit state for the parent customer') end
  if not charge then
    refuse(outbox_key, m, a, usage_json(metric, units, cost, MONEY_ZERO, MONEY_ZERO, true, nil))
    return redis.error_reply('INSUFFICIENT the effective balance is smaller than the cost')
  end
elseif a.sc_fast then
  -- A scoped hash without reservations on the fast path: decided as it drains
  -- (prelude scope_fast).
  charge, debt, draws = scope_fast(a, now, metric, effective, cost, policy == 'block', line_of(ctx), entries, changed)
  if not charge then
    refuse(outbox_key, m, a, usage_json(metric, units, cost, MONEY_ZERO, MONEY_ZERO, true, nil))
    return redis.error_reply('INSUFFICIENT the effective balance is smaller than the cost')
  end
elseif policy == 'block' then
  -- Only blocks that apply to the metric pay (prelude scope_split).
  charge, debt = scope_split(a, now, metric, effective, MONEY_ZERO, cost, line_of(ctx), MONEY_ZERO, nil)
  if not charge then
    refuse(outbox_key, m, a, usage_json(metric, units, cost, MONEY_ZERO, MONEY_ZERO, true, nil))
    return redis.error_reply('INSUFFICIENT the effective balance is smaller than the cost')
  end
elseif m_cmp(effective, cost) < 0 then
  charge = MONEY_ZERO
  if m_pos(effective) then charge = effective end
end
if policy ~= 'block' and not draws and not pool then charge = scope_avail(a, now, metric, charge, MONEY_ZERO, nil) end
local overage = m_sub(m_sub(m_sub(cost, charge), debt), pooled)
local overage_field = nil
if m_pos(overage) then overage_field = overage end

if not draws then
  expire_due(a, now, entries, changed)
  draws = drain(a, now, charge, changed, metric)
end
-- Each member is formatted once for the entry, the usage and the op record
-- (sprintf costs ~2,500 instructions): units as Go wrote them when that is
-- the decimal m_fmt would write (units >= 1, so only a leading zero
-- differs), the charge as the cost when it is the cost, a zero as '0'.
local metric_j, su = j_str(metric), ARGV[11]
if string.byte(su, 1) == 48 then su = m_fmt(units) end
local sc = m_fmt(cost)
local sch, so = sc, '0'
if m_pos(pooled) then
  sch = m_fmt(m_add(m_add(charge, debt), pooled))
elseif m_cmp(charge, cost) ~= 0 and not m_pos(debt) then
  sch = m_fmt(charge)
end
if m_cmp(overage, MONEY_ZERO) ~= 0 then so = m_fmt(overage) end
-- Members debit_entry and this script set later are named (nil): the
-- table is made at its final size.
local e = debit_entry({role = 'main', type = 'consumption', metric_j = metric_j,
  units_s = su, overage = overage_field, open = true, delta = nil, src = nil, block = nil, draws = nil,
  delta_s = nil}, draws)
-- The entry's delta is minus what the draws took, the charge when they
-- took all of it.
if m_cmp(e.delta, m_neg(charge)) == 0 then e.delta_s = m_pos(charge) and ('-' .. ((charge == cost and sc) or m_fmt(charge))) or '0' end
if not line_draw(a, e, debt, draws) then return redis.error_reply('OVERFLOW the debt would not fit in int64') end
entries[#entries + 1] = entry_obj(e)
m.open_meta = entry_meta

if m_pos(pooled) then pool_take(account_key, outbox_key, pool, m, metric, metric_j, pooled, pool_op, pool_ctx) end
local bud_json = budget_count(account_key, bud_hits, a)
a.v = a.v + 1
acct_commit(account_key, a, changed, now)
local usage = usage_json_s(metric_j, su, sc, sch, so, false, nil)
if m_pos(pooled) then usage = string.sub(usage, 1, -2) .. ',"pool":' .. m_fmt(pooled) .. '}' end
m.extra = ',"usage":' .. usage .. bud_json
local json = mutation_json(m, a, entries, changed)
local record = nil
-- A compact record rebuilds the entry's delta from the charge, which a
-- pool draw splits: such a charge keeps its whole Mutation.
if op_key and not m_pos(pooled) then record = op_record_consume(m, #entries - 1, metric, su, sc, sch, so) end
publish(outbox_key, op_key, op_ttl_ms, json, record)
return {'new', json}
