-- budgets.lua owns the budget counters a charge reads, counts and refuses
-- by (docs/rules.md "Budgets").
--
-- Budgets (engine/budgets.go, docs/rules.md "Budgets"): ctx member "bud"
-- (engine.BudgetArg) lists the customer's budgets, each
-- "field|from|end|limit": the counter's hash field "u:<period letter>:
-- <metric key>" (no metric key: every metric), the counting window that
-- reservations now in Unix ms (Go computes it, time zones and DST included) and
-- the limit. The counter's value is "<from> <spent>", then " r" once
-- credit.budget_reached fired in the window: a counter of an earlier
-- window (a smaller from) reads as zero, so a period resets itself; a
-- later one (a context computed before a budget was set again) is kept.

-- budgets_of is the budgets of ctx whose counting window holds now, nil
-- when there are none (one plain find on the context of a customer without
-- budgets). A window starts after now only for a budget set after the
-- command's instant (its since, from another node's clock): what it does
-- not count, the ledger's sum from since (persist fillBudgets) does not
-- count either.
local function budgets_of(ctx, now)
  if not ctx or not string.find(ctx, '"bud":"', 1, true) then return nil end
  local out = {}
  for f, from, to, lim in string.gmatch(string.match(ctx, '"bud":"([^"]*)"') or '', '([^|;]+)|(%d+)|(%d+)|(%d+)') do
    local b = {f = f, from = tonumber(from), to = tonumber(to), lim = m_parse(lim), metric = string.sub(f, 5)}
    if b.from <= now and now < b.to then out[#out + 1] = b end
  end
  if #out == 0 then return nil end
  return out
end

-- budget_fields is extras (acct_read) with the counter fields of buds
-- (budgets_of), so the account read brings them (budget_take with a).
local function budget_fields(extras, buds)
  if not buds then return extras end
  for _, b in ipairs(buds) do extras[#extras + 1] = b.f end
  return extras
end

-- budget_take reads the counters of budgets buds (budgets_of) of account
-- key akey that a charge of cost touches: a budget of every metric (metric
-- key "") counts all of it, one of a metric the cost when the charge is of
-- that metric, or, for a charge of items (each with metric and cost), the
-- items of that metric. Returns
-- the touched counters with their spend after the charge, and the first
-- budget the charge would take past its limit (nil when none), so a
-- caller may refuse before anything is written.
local function budget_take(akey, buds, metric, cost, items, a)
  if not buds then return nil, nil end
  local vals
  if a then
    -- The account was read with the counters (budget_fields).
    vals = {}
    for i, b in ipairs(buds) do vals[i] = a.x[b.f] end
  else
    local names = {}
    for i, b in ipairs(buds) do names[i] = b.f end
    vals = redis.call('HMGET', akey, unpack(names))
  end
  local hits, over = {}, nil
  for i, b in ipairs(buds) do
    local amt = nil
    if b.metric == '' or b.metric == metric then
      amt = cost
    elseif items then
      amt = MONEY_ZERO
      for _, it in ipairs(items) do
        if it.metric == b.metric then amt = m_add(amt, it.cost) end
      end
    end
    if amt and m_pos(amt) then
      local from, spent, flag = b.from, MONEY_ZERO, false
      local sf, ss, sr = string.match(vals[i] or '', '^(%d+) (%d+)(.*)$')
      if sf and tonumber(sf) >= b.from then from, spent, flag = tonumber(sf), m_parse(ss), sr == ' r' end
      local h = {b = b, from = from, spent = spent, after = m_add(spent, amt), flag = flag}
      hits[#hits + 1] = h
      if not over and m_cmp(h.after, b.lim) > 0 then over = h end
    end
  end
  return hits, over
end

-- budget_reach_json is one engine.BudgetReach of counter h at spend spent.
local function budget_reach_json(h, spent)
  return '{"field":' .. j_str(h.b.f) .. ',"limit":' .. m_fmt(h.b.lim) .. ',"spent":' .. m_fmt(spent) ..
    ',"resets":' .. i_fmt(h.b.to) .. '}'
end

-- budget_counter_enc is the counter's hash value.
local function budget_counter_enc(from, spent, reached)
  return i_fmt(from) .. ' ' .. m_fmt(spent) .. ((reached and ' r') or '')
end

-- budget_count writes the counters budget_take read after the charge took
-- place and answers the Mutation's budget member (engine.MutationBudget,
-- "" when no budget was reached): a counter that gets to its limit for the
-- first time in its window owes credit.budget_reached.
local function budget_count(akey, hits, a)
  if not hits or #hits == 0 then return '' end
  local set, reached = {}, {}
  for _, h in ipairs(hits) do
    local at = m_cmp(h.after, h.b.lim) >= 0
    if at and not h.flag then reached[#reached + 1] = budget_reach_json(h, h.after) end
    set[#set + 1], set[#set + 2] = h.b.f, budget_counter_enc(h.from, h.after, at or h.flag)
  end
  if a then
    -- Written by acct_commit's HSET, which runs after.
    a.also = set
  else
    redis.call('HSET', akey, unpack(set))
  end
  if #reached == 0 then return '' end
  return ',"budget":{"reached":[' .. table.concat(reached, ',') .. ']}'
end

-- budget_refuse refuses a charge counter h's budget does not allow: the
-- account is untouched, and the first refusal of the window marks the
-- counter and appends a refusal record (refuse's, with usage, marked
-- refused by a budget) for credit.budget_reached. Answers the BUDGET error
-- reply "<field> <limit> <spent> <end ms>" (lua/scripts.go budgetError).
local function budget_refuse(akey, outbox, m, a, usage, h)
  if not h.flag then
    redis.call('HSET', akey, h.b.f, budget_counter_enc(h.from, h.spent, true))
    m.idem, m.rh = '""', ''
    m.extra = ',"usage":' .. usage .. ',"budget":{"reached":[' .. budget_reach_json(h, h.spent) .. '],"refused":true}'
    redis.call('XADD', outbox, '*', 'm', mutation_json(m, a, {}, {}))
  end
  return redis.error_reply('BUDGET ' .. h.b.f .. ' ' .. m_fmt(h.b.lim) .. ' ' .. m_fmt(h.spent) .. ' ' .. i_fmt(h.b.to))
end
