-- charge.lua owns a consume's charge once priced: who pays the cost under
-- the policy (the customer's blocks, its parent's pool, its credit line,
-- overage) and the consumption entry that records it, for consume.lua and
-- consume_multi.lua. They are functions of the prelude, not of the
-- scripts, because a script's local function is a new closure on every
-- call and a prelude function is made once per library load.

-- consume_split decides who pays cost for metric, charged to account a of
-- effective balance eff with pool (pool_of) under policy: what the blocks
-- pay (charge), what goes on the credit line (debt), the draws when the
-- split drained as it decided (the fast paths, appending to entries and
-- changed) and what the parent's blocks pay (pooled). charge nil: refused
-- (policy block); debt 'NOPOOLSTATE' with it: the parent has no state.
-- Under allow and notify the charge is min(cost, max(eff, 0)), within what
-- the blocks that apply to metric hold, and the rest is overage.
local function consume_split(a, pool, now, metric, eff, cost, ctx, policy, entries, changed)
  local refusing = policy == 'block'
  if pool then
    -- A child: its own blocks, then its parent's, then its line (prelude
    -- pool_fast on a scoped hash read on the fast path, else pool_split).
    if a.sc_fast then return pool_fast(a, pool, now, metric, eff, cost, line_of(ctx), refusing, entries, changed) end
    local charge, debt, pooled = pool_split(a, pool, now, metric, eff, cost, line_of(ctx), refusing)
    return charge, debt, nil, pooled
  end
  if a.sc_fast then
    -- A scoped hash without reservations on the fast path: decided as it
    -- drains (scope_fast).
    local charge, debt, draws = scope_fast(a, now, metric, eff, cost, refusing, line_of(ctx), entries, changed)
    return charge, debt, draws, MONEY_ZERO
  end
  local charge, debt = cost, MONEY_ZERO
  if refusing then
    -- Only blocks that apply to the metric pay (scope_split).
    charge, debt = scope_split(a, now, metric, eff, MONEY_ZERO, cost, line_of(ctx), MONEY_ZERO, nil)
  else
    if m_cmp(eff, cost) < 0 then
      charge = MONEY_ZERO
      if m_pos(eff) then charge = eff end
    end
    charge = scope_avail(a, now, metric, charge, MONEY_ZERO, nil)
  end
  return charge, debt, nil, MONEY_ZERO
end

-- drained is draws when a split drained already (the pool and scoped fast
-- paths), else what draining charge now takes, after the due blocks
-- expire (only metric's blocks when named): consumes and commits alike.
local function drained(a, now, entries, changed, charge, draws, metric)
  if draws then return draws end
  expire_due(a, now, entries, changed)
  return drain(a, now, charge, changed, metric)
end

-- consume_entry drains consume_split's charge (unless it drained: draws)
-- and appends the consumption entry of units (units_arg as Go sent them)
-- of metric at cost, its overage what the blocks, the line and the parent
-- (pooled) leave. It returns the entry's members as text, formatted once
-- for the entry, the usage and the op record: metric, units, cost,
-- charged and overage; nil when the debt would leave int64.
local function consume_entry(a, now, entries, changed, metric, units, units_arg, cost, charge, debt, pooled, draws)
  local overage = m_sub(m_sub(m_sub(cost, charge), debt), pooled)
  local overage_field = nil
  if m_pos(overage) then overage_field = overage end
  draws = drained(a, now, entries, changed, charge, draws, metric)
  -- sprintf costs ~2,500 instructions: units as Go wrote them when that is
  -- the decimal m_fmt would write (units >= 1, so only a leading zero
  -- differs), the charge as the cost when it is the cost, a zero as '0'.
  local metric_j, su = j_str(metric), units_arg
  if string.byte(su, 1) == 48 then su = m_fmt(units) end
  local sc = m_fmt(cost)
  local sch, so = sc, '0'
  if m_pos(pooled) then
    sch = m_fmt(m_add(m_add(charge, debt), pooled))
  elseif m_cmp(charge, cost) ~= 0 and not m_pos(debt) then
    sch = m_fmt(charge)
  end
  if m_cmp(overage, MONEY_ZERO) ~= 0 then so = m_fmt(overage) end
  -- Members debit_entry and this function set later are named (nil): the
  -- table is made at its final size.
  local e = debit_entry({role = 'main', type = 'consumption', metric_j = metric_j,
    units_s = su, overage = overage_field, open = true, delta = nil, src = nil, block = nil, draws = nil,
    delta_s = nil}, draws)
  -- The entry's delta is minus what the draws took, the charge when they
  -- took all of it.
  if m_cmp(e.delta, m_neg(charge)) == 0 then e.delta_s = m_pos(charge) and ('-' .. ((charge == cost and sc) or m_fmt(charge))) or '0' end
  if not line_draw(a, e, debt, draws) then return nil end
  entries[#entries + 1] = entry_obj(e)
  return metric_j, su, sc, sch, so
end

-- items_split is consume_split for the items of a multi-metric consume
-- (each with its cost, of total cost): a scoped account or a child charges
-- each item from the blocks that apply to its metric (scope_items,
-- pool_items), deciding as it drains after the due expiries; else the
-- blocks pay the total.
local function items_split(a, pool, now, items, eff, cost, ctx, policy, entries, changed)
  local refusing = policy == 'block'
  if pool then
    expire_due(a, now, entries, changed)
    return pool_items(a, pool, now, items, eff, cost, line_of(ctx), refusing, changed)
  end
  local charge, debt, draws = cost, MONEY_ZERO, nil
  if a.scoped then
    expire_due(a, now, entries, changed)
    local avail = eff
    if not m_pos(avail) then avail = MONEY_ZERO end
    charge, debt, draws = scope_items(a, now, items, eff, line_of(ctx), refusing, avail, MONEY_ZERO, nil, changed)
  elseif refusing then
    charge, debt = line_split(a, eff, MONEY_ZERO, cost, line_of(ctx))
  elseif m_cmp(eff, cost) < 0 then
    charge = MONEY_ZERO
    if m_pos(eff) then charge = eff end
  end
  return charge, debt, draws, MONEY_ZERO
end

-- items_entry drains items_split's charge (unless it drained: draws) and
-- appends the one consumption entry of a multi-metric consume, with no
-- metric and no units; it returns the overage, or nil when the debt would
-- leave int64.
local function items_entry(a, now, entries, changed, cost, charge, debt, pooled, draws)
  local overage = m_sub(m_sub(m_sub(cost, charge), debt), pooled)
  local overage_field = nil
  if m_pos(overage) then overage_field = overage end
  draws = drained(a, now, entries, changed, charge, draws)
  local e = debit_entry({role = 'main', type = 'consumption', overage = overage_field, open = true}, draws)
  if not line_draw(a, e, debt, draws) then return nil end
  entries[#entries + 1] = entry_obj(e)
  return overage
end

-- items_usage is the usage section of a multi-metric consume refused for
-- credit or by a budget: units su and cost sc (the totals), nothing
-- charged, and the items (items_j).
local function items_usage(su, sc, items_j)
  return '{"metric":"","units":' .. su .. ',"cost":' .. sc .. ',"charged":0,"overage":0,"refused":true,"items":' ..
    items_j .. '}'
end
