-- scopes.lua owns credits scoped to metrics: what a charge or a reservation for
-- a metric may take while every active reservation stays backed.
--
-- Credits scoped to metrics (docs/rules.md "Credits scoped to metrics",
-- docs/decisions.md): a block with a scope (b.scope, ",k1,k2,") pays only
-- for the metrics it names, one without pays for every metric. Reservations stay
-- one reserved total ("rs"), so while any is active every metric m that
-- one holds for must keep E(m) >= rs, E(m) being what the started live
-- blocks that apply to m hold: then each reservation can always be settled from
-- blocks that apply to it, whatever is charged in between. A charge for
-- metric M therefore takes, in spend order, only blocks that apply to M,
-- and no more than keeps that true (scope_free); a reservation may take what
-- keeps it true with itself added (scope_room). A multi-metric reservation
-- (metric "") is backed by unscoped blocks only. Only a hash holding a
-- scoped block (a.scoped) runs these; for any other every block applies to
-- every metric and the figures are the plain ones (line_split). Each is
-- engine.ScopeFree / engine.ScopeRoom in Go (lua TestScopeFreeAgrees).

local RES_METRIC_PAT = '^[^|]*|[^|]*|[^|]*|[^|]*|[^|]*|[^|]*|[^|]*|[^|]*|[^|]*|([^|]*)|'

-- scope_reservations is the distinct metrics of a's active reservations but reservation skip,
-- and each one's index in that list.
local function scope_reservations(a, skip)
  local at, out = {}, {}
  for id, raw in pairs(a.res) do
    if id ~= skip and string.byte(raw, 1) == BYTE_A then
      local m = string.match(raw, RES_METRIC_PAT) or ''
      if not at[m] then out[#out + 1] = m at[m] = #out end
    end
  end
  return out, at
end

-- scope_elig is E(m) for each metric of ms (index by index) at now; at
-- maps each metric to its index. The unscoped credit is summed once and a
-- scoped block visits only its own keys (MAX_LIVE_BLOCKS blocks of 20 keys
-- against as many reservation metrics stay a few thousand look-ups).
local function scope_elig(a, now, ms, at)
  local e, all = {}, MONEY_ZERO
  for i = 1, #ms do e[i] = MONEY_ZERO end
  for _, b in ipairs(a.blocks) do
    if live(b, now) and started(b, now) then
      if b.scope == nil then
        all = m_add(all, b.rem)
      else
        for k in pairs(scope_keys(b)) do
          local i = at[k]
          if i then e[i] = m_add(e[i], b.rem) end
        end
      end
    end
  end
  -- "" (a multi-metric reservation) has the unscoped credit only, like any metric.
  for i = 1, #ms do e[i] = m_add(e[i], all) end
  return e
end

-- scope_free is the most a charge for metric may take from the blocks, up
-- to need (the charge; nil: no bound): the started live blocks that apply
-- to it, walked in spend order as drain takes them, up to where one more
-- unit would leave some reservation metric's E below the reserved total less
-- freed (what the charge settles of its own reservation; skip: that reservation's id when
-- it ends). Never negative.
local function scope_free(a, now, metric, freed, skip, need)
  local hm, at = scope_reservations(a, skip)
  if #hm == 0 then
    -- No reservation to keep backed: every block that applies may pay, so their
    -- sum answers (at least need when they hold it) with no spend-order
    -- walk, and no sort.
    local sum = MONEY_ZERO
    for _, b in ipairs(a.blocks) do
      if live(b, now) and started(b, now) and applies(b, metric) then sum = m_add(sum, b.rem) end
    end
    return sum
  end
  local slack = scope_elig(a, now, hm, at)
  local owed = m_sub(a.rs, freed)
  local elig, taken = {}, {}
  for i = 1, #hm do slack[i], taken[i] = m_sub(slack[i], owed), MONEY_ZERO end
  for _, b in ipairs(a.blocks) do
    if live(b, now) and started(b, now) and applies(b, metric) then elig[#elig + 1] = b end
  end
  table.sort(elig, spends_before)
  local cum, cap = MONEY_ZERO, nil
  -- take: block b's whole remainder counted against reservation metric i.
  local function take(i, b)
    local room = m_sub(slack[i], taken[i])
    if m_cmp(room, b.rem) < 0 then
      if not m_pos(room) then room = MONEY_ZERO end
      local c = m_add(cum, room)
      if not cap or m_cmp(c, cap) < 0 then cap = c end
    end
    taken[i] = m_add(taken[i], b.rem)
  end
  for _, b in ipairs(elig) do
    if need and m_cmp(cum, need) >= 0 then return cum end
    if b.scope == nil then
      for i = 1, #hm do take(i, b) end
    else
      for k in pairs(scope_keys(b)) do
        local i = at[k]
        if i then take(i, b) end
      end
    end
    -- Past a cap every later block only adds (cap < cum from here on).
    if cap then return cap end
    cum = m_add(cum, b.rem)
  end
  return cum
end

-- scope_room is what a new reservation for metric (or a reservation for it growing) may
-- take: min over metric and the metrics of the active reservations of E(m) less
-- the reserved total. May be negative (reservations leaning on the credit line).
local function scope_room(a, now, metric)
  local hm, at = scope_reservations(a, nil)
  if not at[metric] then hm[#hm + 1] = metric at[metric] = #hm end
  local room = nil
  for _, e in ipairs(scope_elig(a, now, hm, at)) do
    local r = m_sub(e, a.rs)
    if not room or m_cmp(r, room) < 0 then room = r end
  end
  return room
end

-- scope_split is line_split for a charge of cost for metric: nil when
-- refused, else what the blocks pay and what goes on the credit line. The
-- line backs every metric, so a charge is refused when its debt would pass
-- the line as well as when the effective balance would.
local function scope_split(a, now, metric, eff, held, cost, lim, freed, skip)
  if not a.scoped then return line_split(a, eff, held, cost, lim) end
  if m_cmp(m_add(m_add(eff, held), lim), cost) < 0 then return nil end
  local pay = m_min(scope_free(a, now, metric, freed, skip, cost), cost)
  local debt = m_sub(cost, pay)
  if m_cmp(m_add(a.d, debt), lim) > 0 then return nil end
  return pay, debt
end

-- scope_avail is what a charge for metric under allow or notify may take
-- when avail (>= 0) is what the account has: avail itself when no block
-- has a scope.
local function scope_avail(a, now, metric, avail, freed, skip)
  if not a.scoped then return avail end
  return m_min(avail, scope_free(a, now, metric, freed, skip, avail))
end

-- scope_reserve_ok: a reservation for metric may grow by cost with line (what the
-- line lends under block) on top of the effective balance eff.
local function scope_reserve_ok(a, now, metric, eff, cost, line)
  if m_cmp(m_add(eff, line), cost) < 0 then return false end
  if not a.scoped then return true end
  return m_cmp(m_add(m_sub(scope_room(a, now, metric), a.d), line), cost) >= 0
end

-- scope_fast decides and drains a charge of cost for metric on a scoped
-- hash without active reservations read on the fast path (a.sc_fast): with no
-- reservation to keep backed, what the blocks may pay is what applies to the
-- metric (scope_free with no reservation metric), which the drain finds walking
-- the spend-order index, reading only blocks up to the charge, so this is
-- decided after draining (nothing is written before acct_commit). refusing:
-- policy block, lim the line. Returns what the blocks paid, what goes on
-- the line and the draws, after expiring what is due; nil when refused.
local function scope_fast(a, now, metric, eff, cost, refusing, lim, entries, changed)
  expire_due(a, now, entries, changed)
  -- What the blocks may pay at most, as line_split and the allow branch
  -- of consume.lua bound it.
  local most = eff
  if refusing then
    if m_cmp(m_add(eff, lim), cost) < 0 then return nil end
    most = m_add(eff, a.d)
  end
  if not m_pos(most) then most = MONEY_ZERO end
  local draws = drain(a, now, m_min(cost, most), changed, metric)
  local paid = MONEY_ZERO
  for _, d in ipairs(draws) do paid = m_add(paid, d.take) end
  local debt = MONEY_ZERO
  if refusing then
    debt = m_sub(cost, paid)
    if m_cmp(m_add(a.d, debt), lim) > 0 then return nil end
  end
  return paid, debt, draws
end

-- draws_merge is the draws all with one draw per block, each block
-- appended to changed once: a block several items drew from is one draw
-- (scope_items, and pool_items for a child and its parent).
local function draws_merge(all, changed)
  local draws, at = {}, {}
  for _, d in ipairs(all) do
    local i = at[d.b]
    if i then
      draws[i].take = m_add(draws[i].take, d.take)
    else
      draws[#draws + 1] = {b = d.b, take = d.take}
      at[d.b] = #draws
      changed[#changed + 1] = d.b
    end
  end
  return draws
end

-- scope_items charges the items {metric, cost} of a multi-metric call on
-- an account holding scoped blocks one after another, each from the
-- blocks that apply to its metric (scope_split under block, refusing;
-- else scope_avail, avail being what the account has), the figures moving
-- as each drains; base is the effective balance plus what the call
-- settles of its reservation. It returns what the blocks paid, what goes on the
-- line and the draws (one per block), appending each block touched once
-- to changed; or nil when an item is refused, every block as it was.
local function scope_items(a, now, items, base, lim, refusing, avail, freed, skip, changed)
  local saved, d0 = {}, a.d
  for i, b in ipairs(a.blocks) do saved[i] = b.rem end
  local paid, debt, touched, all = MONEY_ZERO, MONEY_ZERO, {}, {}
  for _, it in ipairs(items) do
    local pay, owe = nil, MONEY_ZERO
    if refusing then
      pay, owe = scope_split(a, now, it.metric, m_sub(m_sub(base, paid), debt), MONEY_ZERO, it.cost, lim, freed, skip)
      if not pay then
        for i, b in ipairs(a.blocks) do b.rem = saved[i] end
        a.d = d0
        return nil
      end
      -- Counted while the next items are split; line_draw adds it for good.
      a.d = m_add(a.d, owe)
    else
      local left = m_sub(avail, paid)
      if not m_pos(left) then left = MONEY_ZERO end
      pay = m_min(scope_avail(a, now, it.metric, left, freed, skip), it.cost)
    end
    for _, d in ipairs(drain(a, now, pay, touched, it.metric)) do all[#all + 1] = d end
    paid, debt = m_add(paid, pay), m_add(debt, owe)
  end
  a.d = d0
  return paid, debt, draws_merge(all, changed)
end
