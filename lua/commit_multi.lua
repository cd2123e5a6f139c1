-- commit_multi.lua settles an active multi-metric reservation (reserve_multi.lua)
-- at each item's actual units (engine.CommitCommand with Items), each
-- priced at the terms current at commit for its metric: all items or none.
-- It is commit.lua for a list of items, kept apart so the single commit
-- runs no item loop.
--
-- Go sends every item of the reservation, in the reservation's order, with the estimate
-- Postgres stored at the reserve; the script checks the estimates' totals
-- against the reservation (BADARG when they differ, or when the reservation is a
-- single-metric one). Total actual units 0: as commit.lua with 0 units
-- (one zero-delta "release" entry, no usage, metadata discarded). Else the
-- total cost may use the reservation plus the free effective balance; under block
-- a cost past it is INSUFFICIENT and nothing changes; under allow and
-- notify the charge is what fits and the rest is overage. The reservation returns
-- and the charge is drained once: ONE consumption entry (no metric, no
-- units, ref = reservation id, the overage) whose metadata is
-- {"items":[{billable_metric_key, units, cost}]}, as consume_multi.lua
-- writes; usage {metric "", units and cost the totals, charged, overage,
-- reservation, items}. res.items lists each item with its estimate and its
-- actual units and cost, for Postgres.
--
-- KEYS as commit.lua.
-- ARGV[1..9] as commit.lua            ARGV[10] reservation id
-- ARGV[11] metadata JSON text or ""   ARGV[12] n, the number of items (1..20)
-- ARGV[13 + 5(i-1) ..] item i: metric key, estimated units, estimated
--          cost, actual units (>= 0), pricing terms ("" with 0 units)
-- ARGV[13 + 5n], ARGV[14 + 5n] optional: the reservation's field "r:<id>" as
--          Go read it with its stored metadata and ARGV[11] merged into that
--          metadata by Go, as commit.lua's ARGV[15] and ARGV[16] (STALE
--          when the field moved)
--
-- Reply: {"new"|"replay", mutation JSON}; errors as commit.lua.
local account_key, outbox_key, rexp_key, op_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local now = int_parse(ARGV[1])
local op_id, tenant, env, customer = ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local idem, request_hash, op_ttl_ms, ctx = ARGV[6], ARGV[7], ARGV[8], ARGV[9]
local res_id, meta, n = ARGV[10], ARGV[11], tonumber(ARGV[12])

if not now or res_id == '' or not n or n < 1 or n > 20 or (#ARGV ~= 12 + 5 * n and #ARGV ~= 14 + 5 * n) then
  return redis.error_reply('BADARG now, reservation id or items')
end
local stored_res, merged_meta = ARGV[13 + 5 * n], ARGV[14 + 5 * n]
local items, actual, est_units, est_cost = commit_items(ARGV, n)
if not items then return actual end

local a, r, reply = commit_open(account_key, now, res_id, m_pos(actual), op_key, request_hash, seen_keys(KEYS, 5),
  merged_meta ~= nil)
if reply then return reply end
if r.metric ~= '' then return redis.error_reply('BADARG the reservation holds one metric') end
if m_cmp(est_units, r.est_units) ~= 0 or m_cmp(est_cost, r.est_cost) ~= 0 then
  return redis.error_reply('BADARG the items do not add up to the reservation')
end

local cost, res_parts, use_parts, costs = commit_items_price(items, ARGV)
if not cost then return res_parts end

local _, _, effective = acct_bal(a, now)
local entries, changed = {}, {}
local m = {op = op_id, kind = 'commit', tenant = tenant, customer = customer, env = env,
  idem = idem, rh = request_hash, now = now, ctx = ctx, eb = effective, res = r}
if m_pos(actual) then
  -- As commit.lua: charge is what the blocks pay, debt what goes on the
  -- credit line (prelude commit_items_split).
  local charge, overage, debt, draws = commit_items_split(a, now, r, res_id, items, costs, effective, cost, ctx,
    entries, changed)
  if not charge then
    refuse(outbox_key, {op = op_id, kind = 'commit', tenant = tenant, customer = customer, env = env,
      now = now, ctx = ctx, eb = effective}, a, usage_json('', actual, cost, MONEY_ZERO, MONEY_ZERO, true, nil))
    return redis.error_reply('INSUFFICIENT the reservation and the free balance are smaller than the cost')
  end
  local merged, stop = commit_meta(r, meta, stored_res, merged_meta, a.x['r:' .. res_id])
  if not merged then return stop end
  local use_j = commit_items_entry(a, now, r, res_id, entries, changed, charge, overage, debt, draws, use_parts)
  if not use_j then return redis.error_reply('OVERFLOW the debt would not fit in int64') end
  charge = m_add(charge, debt)
  m.open_meta = '{"items":' .. use_j .. '}'
  r.meta = merged
  m.extra = ',"usage":{"metric":"","units":' .. m_fmt(actual) .. ',"cost":' .. m_fmt(cost) ..
    ',"charged":' .. m_fmt(charge) .. ',"overage":' .. m_fmt(overage) .. ',"reservation":' .. q(res_id) ..
    ',"items":' .. use_j .. '}'
else
  expire_due(a, now, entries, changed)
  a.rs = m_sub(a.rs, r.est_cost)
  entries[#entries + 1] = entry_obj({role = 'main', delta = MONEY_ZERO, type = 'release', ref = res_id})
end

r.status, r.final, r.act_units, r.act_cost, r.released = 'committed', now, actual, cost, r.est_cost
r.items = '[' .. table.concat(res_parts, ',') .. ']'
res_put(a, r)
a.v = a.v + 1
acct_commit(account_key, a, changed, now)
-- As commit.lua: the budgets count the cost, never refusing it.
if m_pos(cost) then
  m.extra = (m.extra or '') .. budget_count(account_key, (budget_take(account_key, budgets_of(ctx, now), '', cost, items)))
end
redis.call('ZREM', rexp_key, res_member(tenant, env, customer, res_id))
local json = mutation_json(m, a, entries, changed)
publish(outbox_key, op_key, op_ttl_ms, json)
return {'new', json}
