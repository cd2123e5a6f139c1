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
-- The "bud" text is parsed once per text and remembered in the library,
-- as terms_cached remembers terms: a customer's budgets are one text for a
-- whole period, and parsing it (a pattern match, a gmatch, a decimal
-- parse per figure) cost ~70,000 Redis instructions, an eighth of a
-- consume. The parsed budgets are only read. Its cache is a local of the
-- do block, not of the chunk (m_fits').
local budgets_of
do
  local BUD_CACHE, BUD_OLD, BUD_CACHED, BUD_CACHE_MAX = {}, {}, 0, 512
  local function parse(s)
    local all = {}
    for f, from, to, lim in string.gmatch(s, '([^|;]+)|(%d+)|(%d+)|(%d+)') do
      all[#all + 1] = {f = f, from = tonumber(from), to = tonumber(to), lim = m_parse(lim), metric = string.sub(f, 5)}
    end
    if MONEY_GENERAL.on then all.big = true end
    return all
  end
  function budgets_of(ctx, now)
    if not ctx then return nil end
    local i = string.find(ctx, '"bud":"', 1, true)
    if not i then return nil end
    local j = string.find(ctx, '"', i + 7, true)
    if not j then return nil end
    local s = string.sub(ctx, i + 7, j - 1)
    local all = BUD_CACHE[s]
    if not all then
      all = BUD_OLD[s] or parse(s)
      if BUD_CACHED >= BUD_CACHE_MAX then BUD_CACHE, BUD_OLD, BUD_CACHED = {}, BUD_CACHE, 0 end
      BUD_CACHE[s], BUD_CACHED = all, BUD_CACHED + 1
    end
    if all.big then MONEY_GENERAL.general() end
    local out = nil
    for _, b in ipairs(all) do
      if b.from <= now and now < b.to then
        out = out or {}
        out[#out + 1] = b
      end
    end
    return out
  end
end

-- budget_fields is extras (acct_read) with the counter fields of buds
-- (budgets_of), so the account read brings them (budget_take with a).
local function budget_fields(extras, buds)
  if not buds then return extras end
  for _, b in ipairs(buds) do extras[#extras + 1] = b.f end
  return extras
end

-- budget_counter_enc is the counter's hash value; budget_counter_dec reads
-- one back: its from, spent and reached flag, nil when v is not a counter.
-- A counter is rewritten by every charge it counts, and the next charge
-- reads the text the last one wrote, so the codec remembers each text it
-- writes or reads with its figures (two generations, as terms_cached):
-- parsing one (a pattern match and two decimal parses) cost ~10,000 Redis
-- instructions, twice a consume of a customer with two budgets. A
-- counter's figures are a function of its text alone, so a remembered
-- text is always read right, whoever wrote it. The figures are only read.
-- The memos are locals of the do block, not of the chunk (m_fits').
local budget_counter_enc, budget_counter_dec
do
  local CNT, CNT_OLD, CNT_N, CNT_MAX = {}, {}, 0, 2048
  -- A window's start is written by every charge in it: its text is kept
  -- per start (sprintf costs ~2,500 instructions).
  local FROM_TEXT, FROM_N = {}, 0
  local function remember(v, c)
    if CNT_N >= CNT_MAX then CNT, CNT_OLD, CNT_N = {}, CNT, 0 end
    CNT[v], CNT_N = c, CNT_N + 1
  end
  function budget_counter_enc(from, spent, reached)
    local fs = FROM_TEXT[from]
    if not fs then
      if FROM_N >= 64 then FROM_TEXT, FROM_N = {}, 0 end
      fs = i_fmt(from)
      FROM_TEXT[from], FROM_N = fs, FROM_N + 1
    end
    local flag = reached and true or false
    local v = fs .. ' ' .. m_fmt(spent) .. ((flag and ' r') or '')
    if not CNT[v] then
      local c = {from, spent, flag}
      if MONEY_GENERAL.on then c.big = true end
      remember(v, c)
    end
    return v
  end
  function budget_counter_dec(v)
    if not v then return nil end
    local c = CNT[v]
    if not c then
      c = CNT_OLD[v]
      if not c then
        local sf, ss, sr = string.match(v, '^(%d+) (%d+)(.*)$')
        if not sf then return nil end
        c = {tonumber(sf), m_parse(ss), sr == ' r'}
        if MONEY_GENERAL.on then c.big = true end
      end
      remember(v, c)
    end
    if c.big then MONEY_GENERAL.general() end
    return c[1], c[2], c[3]
  end
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
      local cf, cs, cr = budget_counter_dec(vals[i])
      if cf and cf >= b.from then from, spent, flag = cf, cs, cr end
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
