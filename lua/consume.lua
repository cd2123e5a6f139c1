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
-- Reply: {"new", the compact op record when the script stored one, else
-- the mutation JSON} or {"replay", stored op record} (the
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

-- charge is what the blocks pay, debt what goes on the credit line, pooled
-- what the parent's blocks pay (prelude consume_split).
local entries, changed = {}, {}
local charge, debt, draws, pooled = consume_split(a, pool, now, metric, effective, cost, ctx, policy, entries, changed)
if debt == 'NOPOOLSTATE' then return redis.error_reply('NOPOOLSTATE no credit state for the parent customer') end
if not charge then
  refuse(outbox_key, m, a, usage_json(metric, units, cost, MONEY_ZERO, MONEY_ZERO, true, nil))
  return redis.error_reply('INSUFFICIENT the effective balance is smaller than the cost')
end
local metric_j, su, sc, sch, so = consume_entry(a, now, entries, changed, metric, units, ARGV[11], cost, charge, debt,
  pooled, draws)
if not metric_j then return redis.error_reply('OVERFLOW the debt would not fit in int64') end
m.open_meta = entry_meta

if pooled ~= MONEY_ZERO and m_pos(pooled) then pool_take(account_key, outbox_key, pool, m, metric, metric_j, pooled, pool_op, pool_ctx) end
local bud_json = budget_count(account_key, bud_hits, a)
a.v = a.v + 1
acct_commit(account_key, a, changed, now)
local usage = usage_json_s(metric_j, su, sc, sch, so, false, nil)
if pooled ~= MONEY_ZERO and m_pos(pooled) then usage = string.sub(usage, 1, -2) .. ',"pool":' .. m_fmt(pooled) .. '}' end
m.extra = ',"usage":' .. usage .. bud_json
local json = mutation_json(m, a, entries, changed)
local record = nil
-- A compact record rebuilds the entry's delta from the charge, which a
-- pool draw splits: such a charge keeps its whole Mutation.
if op_key and (pooled == MONEY_ZERO or not m_pos(pooled)) then record = op_record_consume(m, #entries - 1, metric, su, sc, sch, so) end
publish(outbox_key, op_key, op_ttl_ms, json, record)
-- The caller builds its answer from the record's figures alone (the
-- Mutation is the outbox's): a fifth of the bytes to send and to decode.
if record then return {'new', record} end
return {'new', json}
