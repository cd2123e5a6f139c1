-- settle.lua owns a commit's settlement once priced: who pays the cost
-- (the blocks, the reservation it frees, the credit line, overage), the
-- consumption entry that records it and the settled figures the
-- reservation keeps, for commit.lua and commit_multi.lua.

-- commit_split decides a commit's charge of cost for reservation r (res_id),
-- which holds held, on account a of effective balance eff: what the blocks
-- pay, the overage and the debt on the credit line. Under block (ctx) a
-- cost past the reservation plus the free balance is refused (nil) unless
-- the line covers it (scope_split; debt is what goes on it); under allow
-- and notify the commit takes what is there and the rest is overage, so
-- actual_cost can read higher than what was collected
-- (docs/spec/interface.md Reservation). Only blocks that apply to r's
-- metric pay; the reservation ends, or a partial commit frees the part it
-- settles.
local function commit_split(a, now, r, res_id, eff, held, cost, ctx, partial)
  if refuses(ctx) then
    local freed, skip = held, res_id
    if partial then freed, skip = m_min(cost, held), nil end
    local charge, debt = scope_split(a, now, r.metric, eff, held, cost, line_of(ctx), freed, skip)
    return charge, MONEY_ZERO, debt
  end
  local available = m_add(eff, held)
  if not m_pos(available) then available = MONEY_ZERO end
  local freed, skip = held, res_id
  if partial then freed, skip = m_min(cost, held), nil end
  available = scope_avail(a, now, r.metric, available, freed, skip)
  if m_cmp(cost, available) > 0 then return available, m_sub(cost, available), MONEY_ZERO end
  return cost, MONEY_ZERO, MONEY_ZERO
end

-- commit_entry drains commit_split's charge from the blocks that apply to
-- reservation r's metric and appends the consumption entry of units_s
-- (the actual units' text), ref res_id, with the overage and the debt.
-- It returns the cost's text and the Mutation's usage member, or nil when
-- the debt would leave int64.
local function commit_entry(a, now, r, res_id, entries, changed, units_s, cost, charge, overage, debt)
  local overage_field = nil
  if m_pos(overage) then overage_field = overage end
  local draws = drain(a, now, charge, changed, r.metric)
  local metric_j = j_str(r.metric)
  local e = debit_entry({role = 'main', type = 'consumption', metric_j = metric_j,
    units_s = units_s, ref = res_id, overage = overage_field}, draws)
  if not line_draw(a, e, debt, draws) then return nil end
  entries[#entries + 1] = entry_obj(e)
  charge = m_add(charge, debt)
  local cost_s = m_fmt(cost)
  return cost_s, ',"usage":' .. usage_json_s(metric_j, units_s, cost_s, (charge == cost and cost_s) or m_fmt(charge),
    m_fmt(overage), false, res_id)
end

-- commit_settle records on reservation r (of account a) what a commit of
-- actual units at cost settled: after partial commits the reservation's
-- actual units and cost are the totals of every part (the resource's
-- actual_units; this part is the entry's). A partial commit counts take
-- as released and keeps r open; a final commit marks it committed with
-- all it held (held) released. It returns the OVERFLOW reply when a total
-- leaves int64, else nil.
local function commit_settle(a, r, now, actual, cost, take, held, partial, units_s, cost_s)
  local total_units, total_cost = actual, cost
  if r.act_units then
    total_units, total_cost = m_add(r.act_units, actual), m_add(r.act_cost or MONEY_ZERO, cost)
    if not m_fits(total_units) or not m_fits(total_cost) then
      return redis.error_reply('OVERFLOW the settled units or cost would not fit in int64')
    end
  end
  if partial then
    r.act_units, r.act_cost, r.released = total_units, total_cost, m_add(r.released, take)
  else
    r.status, r.final, r.act_units, r.act_cost, r.released = 'committed', now, total_units, total_cost, held
  end
  if total_units == actual then
    res_set(r, 'act_units', units_s)
    res_set(r, 'act_cost', cost_s)
  end
  if partial then res_update(a, r) else res_put(a, r) end
end

-- commit_items_split is commit_split for a multi-metric reservation r,
-- which ends, freeing all it held (its estimated cost): a scoped account
-- charges each item (its cost in costs) from the blocks that apply to its
-- metric (scope_items), deciding as it drains after the due expiries, and
-- the draws come fourth; else line_split under block. nil when refused.
local function commit_items_split(a, now, r, res_id, items, costs, eff, cost, ctx, entries, changed)
  if a.scoped then
    for i, it in ipairs(items) do it.cost = costs[i] end
    expire_due(a, now, entries, changed)
    local avail = m_add(eff, r.est_cost)
    if not m_pos(avail) then avail = MONEY_ZERO end
    local charge, debt, draws = scope_items(a, now, items, m_add(eff, r.est_cost), line_of(ctx), refuses(ctx), avail,
      r.est_cost, res_id, changed)
    if not charge then return nil end
    return charge, m_sub(m_sub(cost, charge), debt), debt, draws
  end
  if refuses(ctx) then
    local charge, debt = line_split(a, eff, r.est_cost, cost, line_of(ctx))
    return charge, MONEY_ZERO, debt, nil
  end
  local available = m_add(eff, r.est_cost)
  if not m_pos(available) then available = MONEY_ZERO end
  if m_cmp(cost, available) > 0 then return available, m_sub(cost, available), MONEY_ZERO, nil end
  return cost, MONEY_ZERO, MONEY_ZERO, nil
end

-- commit_items_entry drains commit_items_split's charge (unless it
-- drained: draws), takes reservation r's estimated cost off the reserved
-- total and appends the one consumption entry of a multi-metric commit,
-- ref res_id, with no metric and no units. It returns the items' JSON list (use_parts joined) for the
-- entry's metadata and the usage, or nil when the debt would leave int64.
local function commit_items_entry(a, now, r, res_id, entries, changed, charge, overage, debt, draws, use_parts)
  local overage_field = nil
  if m_pos(overage) then overage_field = overage end
  draws = drained(a, now, entries, changed, charge, draws)
  a.rs = m_sub(a.rs, r.est_cost)
  local use_j = '[' .. table.concat(use_parts, ',') .. ']'
  local e = debit_entry({role = 'main', type = 'consumption', ref = res_id, overage = overage_field, open = true},
    draws)
  if not line_draw(a, e, debt, draws) then return nil end
  entries[#entries + 1] = entry_obj(e)
  return use_j
end
