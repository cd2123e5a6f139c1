-- pools.lua owns a child customer's draws on its parent's blocks
-- (docs/rules.md "Shared pools").
--
-- Shared pools (docs/rules.md "Shared pools"): a child customer spends its
-- own blocks, then its parent's (one level), up to an optional draw limit
-- per period counted in the child's hash like a budget (field "p:d" or
-- "p:m", "<from> <drawn>"). The parent's hash shares the child's slot (the
-- child's id is minted there: docs/decisions.md "Shared pools"), so the
-- script names it from the child's key.

-- pool_of reads the pool argument (engine.PoolArg) of the child whose
-- account key is akey: nil without a parent, else {key, id} and, with a
-- draw limit whose window holds now, {f, from, to, lim}. Nothing is read
-- yet: pool_split reads the parent and the draw counter only for a charge
-- the child's own credit does not cover.
-- The argument is parsed once per text and remembered in the library, as
-- budgets_of remembers budgets (it is one text per parent and period;
-- parsing it cost ~40,000 Redis instructions a charge). The parsed
-- argument is only read; each call gets a table of its own.
local pool_of
do
  local POOL_CACHE, POOL_OLD, POOL_CACHED, POOL_CACHE_MAX = {}, {}, 0, 512
  -- parse is {id, f, from, to, lim} of arg (no f without a draw limit),
  -- false when arg names no parent.
  local function parse(arg)
    local id, rest = string.match(arg, '^([0-9a-f-]+)(.*)$')
    if not id or #id ~= 36 then return false end
    local f, from, to, lim = string.match(rest, '^|([^|]+)|(%d+)|(%d+)|(%d+)$')
    if not f then return {id} end
    local c = {id, f, tonumber(from), tonumber(to), m_parse(lim)}
    if MONEY_GENERAL.on then c.big = true end
    return c
  end
  function pool_of(akey, arg, now)
    if not arg or arg == '' then return nil end
    local c = POOL_CACHE[arg]
    if c == nil then
      c = POOL_OLD[arg]
      if c == nil then c = parse(arg) end
      if POOL_CACHED >= POOL_CACHE_MAX then POOL_CACHE, POOL_OLD, POOL_CACHED = {}, POOL_CACHE, 0 end
      POOL_CACHE[arg], POOL_CACHED = c, POOL_CACHED + 1
    end
    if not c then return nil end
    if c.big then MONEY_GENERAL.general() end
    local id = c[1]
    local p = {id = id, key = string.sub(akey, 1, #akey - 36) .. id, lim = nil, a = nil, akey = akey}
    if c[2] and c[3] <= now and now < c[4] then
      p.f, p.from, p.to, p.lim = c[2], c[3], c[4], c[5]
    end
    return p
  end
end

-- pool_read reads the parent's account into p.a and the child's draw
-- counter into p.drawn; false when Redis holds no state for the parent.
local function pool_read(p, now)
  p.a = acct_read(p.key, now, {}, false, false)
  if not p.a then return false end
  if p.lim then
    p.drawn = MONEY_ZERO
    local cf, cs = budget_counter_dec(redis.call('HGET', p.akey, p.f) or nil)
    if cf and cf >= p.from then p.from, p.drawn = cf, cs end
  end
  return true
end

-- pool_free is what account a's blocks may pay for metric beyond its
-- reservations, up to need, never negative: own tells the child (its effective
-- balance before its debt, which its line backs) from the parent (its
-- effective balance net of its debt: a child never draws a parent's line).
-- eff is a's effective balance at now when the caller has it (acct_bal's
-- third figure, which sums every block of an account read whole).
local function pool_free(a, now, metric, need, own, eff)
  if not eff then
    local _, _, e = acct_bal(a, now)
    eff = e
  end
  local free = eff
  if own then free = m_add(eff, a.d) end
  if a.scoped then free = m_min(free, scope_free(a, now, metric, MONEY_ZERO, nil, need)) end
  if not m_pos(free) then return MONEY_ZERO end
  return m_min(free, need)
end

-- pool_cap is pooled within what p's draw limit leaves (p read).
local function pool_cap(p, pooled)
  if not p.lim then return pooled end
  local left = m_sub(p.lim, p.drawn)
  if not m_pos(left) then return MONEY_ZERO end
  return m_min(pooled, left)
end

-- pool_split decides a charge of cost for metric by child a with pool p
-- (pool_of): what the child's blocks pay, what goes on its credit line
-- (lim, under block only) and what the parent's blocks pay, in that order
-- of asking: own blocks, the parent, the line. nil when refusing (policy
-- block) and the three fall short of cost; under allow and notify the
-- rest is overage. nil, 'NOPOOLSTATE' when the parent must be read and
-- Redis holds no state for it.
local function pool_split(a, p, now, metric, eff, cost, lim, refusing)
  local own = pool_free(a, now, metric, cost, refusing, eff)
  local need = m_sub(cost, own)
  local pooled = MONEY_ZERO
  if m_pos(need) then
    if not pool_read(p, now) then return nil, 'NOPOOLSTATE' end
    pooled = pool_cap(p, pool_free(p.a, now, metric, need, false))
  end
  if not refusing then return own, MONEY_ZERO, pooled end
  local debt = m_sub(need, pooled)
  -- The line backs what the blocks and the pool leave, within what the
  -- child's reservations leave of it (eff counts them), as scope_split asks.
  if m_cmp(m_add(m_add(eff, lim), pooled), cost) < 0 or m_cmp(m_add(a.d, debt), lim) > 0 then return nil end
  return own, debt, pooled
end

-- pool_fast is pool_split for a scoped child read on the fast path
-- (a.sc_fast, no active reservation), deciding as it drains as scope_fast does:
-- the child's blocks that apply to metric pay what they hold, then the
-- parent, then the line. Returns what the child's blocks paid, the debt,
-- the draws and what the parent pays; nil when refused, nil,
-- 'NOPOOLSTATE' as pool_split.
local function pool_fast(a, p, now, metric, eff, cost, lim, refusing, entries, changed)
  expire_due(a, now, entries, changed)
  local most = eff
  if refusing then most = m_add(eff, a.d) end
  if not m_pos(most) then most = MONEY_ZERO end
  local draws = drain(a, now, m_min(cost, most), changed, metric)
  local paid = MONEY_ZERO
  for _, d in ipairs(draws) do paid = m_add(paid, d.take) end
  local need, pooled, debt = m_sub(cost, paid), MONEY_ZERO, MONEY_ZERO
  if m_pos(need) then
    if not pool_read(p, now) then return nil, 'NOPOOLSTATE' end
    pooled = pool_cap(p, pool_free(p.a, now, metric, need, false))
  end
  if refusing then
    debt = m_sub(need, pooled)
    if m_cmp(m_add(m_add(eff, lim), pooled), cost) < 0 or m_cmp(m_add(a.d, debt), lim) > 0 then return nil end
  end
  return paid, debt, draws, pooled
end

-- pool_take drains pooled from the parent's blocks (p.a) for the child's
-- charge for metric, and appends the parent's Mutation (kind debit, one
-- pool_draw entry naming the child as its reference; its op id and
-- context are Go's, engine.PoolDraw) to the outbox; with a draw limit it
-- counts the draw in the child's hash (akey). A multi-metric charge
-- (pool_items) has drained the parent already (p.draws): its entry has no
-- metric (metric_j nil), as the child's has none.
local function pool_take(akey, outbox, p, m, metric, metric_j, pooled, op, ctx)
  local pa, entries, changed, draws, before = p.a, p.entries, p.changed, p.draws, p.eb
  if not draws then
    local _, _, eb = acct_bal(pa, m.now)
    entries, changed, before = {}, {}, eb
    expire_due(pa, m.now, entries, changed)
    draws = drain(pa, m.now, pooled, changed, metric)
  end
  entries[#entries + 1] = entry_obj(debit_entry({role = 'main', type = 'pool_draw', metric_j = metric_j,
    ref = m.customer, open = false, delta = nil, src = nil, block = nil, draws = nil}, draws))
  pa.v = pa.v + 1
  acct_commit(p.key, pa, changed, m.now)
  local pm = {op = op, kind = 'debit', tenant = m.tenant, customer = p.id, env = m.env, idem = '""', rh = '',
    now = m.now, ctx = ctx, eb = before}
  redis.call('XADD', outbox, '*', 'm', mutation_json(pm, pa, entries, changed))
  if p.lim then redis.call('HSET', akey, p.f, budget_counter_enc(p.from, m_add(p.drawn, pooled), false)) end
end

-- pool_items decides and drains a multi-metric charge (consume_multi.lua)
-- of the items {metric, cost} by child a with pool p, as pool_split decides
-- one metric's: each item takes from the child's blocks that apply to its
-- metric (scope_items' rule), what they leave from the parent's blocks that
-- apply to it, within the parent's effective balance and the draw limit,
-- and what both leave goes on the line (under block, refusing) or is
-- overage. Returns what the child's blocks paid, the debt, the child's
-- draws (one per block, each block appended to changed once) and what the
-- parent pays (its draws, expiries and figure before in p.draws,
-- p.entries, p.changed and p.eb for pool_take); nil when refused, every
-- block of the child as it was; nil, 'NOPOOLSTATE' as pool_split.
-- Its helpers are locals of the do block, not of the chunk (drain's).
local pool_items
do
  -- take_each pays each item's it.need from account x, at most room in
  -- all, what x's blocks that apply to its metric hold (scope_free; x
  -- unscoped: every block applies, drained once for the total, as the
  -- fast path needs: its drain reads the blocks afresh), lowering it.need;
  -- it returns what x paid and its draws, merged.
  local function take_each(x, now, items, room, changed)
    local paid, all = MONEY_ZERO, {}
    for _, it in ipairs(items) do
      local left = m_sub(room, paid)
      if not m_pos(left) then left = MONEY_ZERO end
      local pay = m_min(left, it.need)
      if x.scoped and m_pos(pay) then
        pay = m_min(pay, scope_free(x, now, it.metric, MONEY_ZERO, nil, pay))
        for _, d in ipairs(drain(x, now, pay, {}, it.metric)) do all[#all + 1] = d end
      end
      it.need, paid = m_sub(it.need, pay), m_add(paid, pay)
    end
    if not x.scoped then all = drain(x, now, paid, {}) end
    return paid, draws_merge(all, changed)
  end

  function pool_items(a, p, now, items, eff, cost, lim, refusing, changed)
    local saved = {}
    for i, b in ipairs(a.blocks) do saved[i] = b.rem end
    local most = eff
    if refusing then most = m_add(eff, a.d) end
    for _, it in ipairs(items) do it.need = it.cost end
    local paid, draws = take_each(a, now, items, most, changed)
    local pooled = MONEY_ZERO
    p.draws, p.entries, p.changed = {}, {}, {}
    if m_cmp(paid, cost) < 0 then
      if not pool_read(p, now) then return nil, 'NOPOOLSTATE' end
      local _, _, pe = acct_bal(p.a, now)
      p.eb = pe
      expire_due(p.a, now, p.entries, p.changed)
      if not m_pos(pe) then pe = MONEY_ZERO end
      pooled, p.draws = take_each(p.a, now, items, pool_cap(p, pe), p.changed)
    end
    local debt = MONEY_ZERO
    if refusing then
      debt = m_sub(m_sub(cost, paid), pooled)
      if m_cmp(m_add(m_add(eff, lim), pooled), cost) < 0 or m_cmp(m_add(a.d, debt), lim) > 0 then
        for i, b in ipairs(a.blocks) do b.rem = saved[i] end
        return nil
      end
    end
    return paid, debt, draws, pooled
  end
end
