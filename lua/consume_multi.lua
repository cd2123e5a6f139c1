-- consume_multi.lua prices several metrics' units and charges their total
-- in one step (engine.ConsumeCommand with Items): every item or none. It
-- is consume.lua for a list of items, kept apart so the single consume, the
-- hot path, runs no item loop.
--
-- Under policy block a total above the effective balance changes nothing
-- in the account: the script appends a refusal record (usage.refused, no
-- entries) and answers INSUFFICIENT, as consume.lua does. Under allow and
-- notify the charge is min(total, max(effective, 0)) and the rest is
-- overage. Blocks are drained once, for the total.
--
-- Entries: ONE consumption entry for the whole call (issue 10), with no
-- metric and no units (several metrics paid), the overage, and the item
-- breakdown as member "items" of its metadata ([{billable_metric_key,
-- units, cost}]), so Postgres stores it in the row it writes anyway.
-- usage.items carries the same text; usage.metric is "" and usage.units
-- the items' total.
--
-- KEYS as consume.lua.
-- ARGV[1..9] as consume.lua
-- ARGV[10] policy: block, allow or notify
-- ARGV[11] entry metadata JSON text or "" (never holding member "items")
-- ARGV[12] n, the number of items (1..20)
-- ARGV[13 + 3(i-1) ..] item i: metric key, units (decimal, >= 1), pricing
--          terms (prelude terms_parse)
-- ARGV[13 + 3n], ARGV[14 + 3n], ARGV[15 + 3n] optional: the pool of a
--          child customer, the op id of the parent's Mutation and its
--          context, as consume.lua's ARGV[15..17]
--
-- A child spends, item by item, its own blocks that apply to the item's
-- metric, then its parent's that apply to it within its draw limit, then
-- its credit line (prelude pool_items; docs/rules.md "Shared pools"): the
-- parent's part is the parent's own Mutation (prelude pool_take, its
-- pool_draw entry without a metric), appended before the child's, and
-- usage.pool names it, as consume.lua's.
--
-- Reply: {"new", mutation JSON} or {"replay", stored Mutation JSON};
-- errors NOSTATE, NOPOOLSTATE, MISMATCH, INSUFFICIENT (block), BUDGET, OVERFLOW (an item's
-- cost, the total cost or the total units leave int64), BADTERMS, BADARG.
local account_key, outbox_key, op_key = KEYS[1], KEYS[2], KEYS[3]
local now = int_parse(ARGV[1])
local op_id, tenant, env, customer = ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local idem, request_hash, op_ttl_ms, ctx = ARGV[6], ARGV[7], ARGV[8], ARGV[9]
local policy, entry_meta, n = ARGV[10], ARGV[11], tonumber(ARGV[12])

if not now or not n or n < 1 or n > 20 or (#ARGV ~= 12 + 3 * n and #ARGV ~= 15 + 3 * n) or
    (policy ~= 'block' and policy ~= 'allow' and policy ~= 'notify') then
  return redis.error_reply('BADARG now, policy or items')
end
local items, bad = consume_items(ARGV, n)
if not items then return bad end
local pool_arg, pool_op, pool_ctx = ARGV[13 + 3 * n] or '', ARGV[14 + 3 * n] or '', ARGV[15 + 3 * n] or ''

local a = acct_read(account_key, now, {'o'})
if not a then return redis.error_reply('NOSTATE no credit state for the customer') end
local r = replay(op_key, request_hash, seen_keys(KEYS, 4))
if r then return r end
local pool = pool_of(account_key, pool_arg, now)

local cost, units, items_j, bad = items_price(items, 'units', 'cost')
if bad then return bad end

local _, _, effective = acct_bal(a, now)
local m = {op = op_id, kind = 'consume', tenant = tenant, customer = customer, env = env,
  idem = idem, rh = request_hash, now = now, ctx = ctx, eb = effective}
local su, sc = m_fmt(units), m_fmt(cost)

-- Budgets as consume.lua's: one of every metric counts the total, one of
-- a metric its items' costs.
local bud_hits, bud_over = budget_take(account_key, budgets_of(ctx, now), '', cost, items)
if bud_over then return budget_refuse(account_key, outbox_key, m, a, items_usage(su, sc, items_j), bud_over) end

-- charge is what the blocks pay, debt what goes on the credit line, pooled
-- what the parent's blocks pay (prelude items_split).
local entries, changed = {}, {}
local charge, debt, draws, pooled = items_split(a, pool, now, items, effective, cost, ctx, policy, entries, changed)
if debt == 'NOPOOLSTATE' then return redis.error_reply('NOPOOLSTATE no credit state for the parent customer') end
if not charge then
  refuse(outbox_key, m, a, items_usage(su, sc, items_j))
  return redis.error_reply('INSUFFICIENT the effective balance is smaller than the cost')
end
local overage = items_entry(a, now, entries, changed, cost, charge, debt, pooled, draws)
if not overage then return redis.error_reply('OVERFLOW the debt would not fit in int64') end

-- The breakdown opens the entry's metadata (Go refuses a caller's own
-- member "items" in this form, so the object has no duplicate name).
if entry_meta == '' or entry_meta == '{}' then
  m.open_meta = '{"items":' .. items_j .. '}'
else
  m.open_meta = '{"items":' .. items_j .. ',' .. string.sub(entry_meta, 2)
end

-- The parent's Mutation goes first, as consume.lua's.
if m_pos(pooled) then pool_take(account_key, outbox_key, pool, m, nil, nil, pooled, pool_op, pool_ctx) end
a.v = a.v + 1
acct_commit(account_key, a, changed, now)
local pool_j = ''
if m_pos(pooled) then pool_j = ',"pool":' .. m_fmt(pooled) end
m.extra = ',"usage":{"metric":"","units":' .. su .. ',"cost":' .. sc .. ',"charged":' ..
  m_fmt(m_add(m_add(charge, debt), pooled)) .. ',"overage":' .. m_fmt(overage) .. ',"items":' .. items_j .. pool_j .. '}' ..
  budget_count(account_key, bud_hits)
local json = mutation_json(m, a, entries, changed)
-- The op record is the Mutation itself: the compact consume record has
-- room for one metric.
publish(outbox_key, op_key, op_ttl_ms, json, nil)
return {'new', json}
