-- credit_line.lua owns how far below zero a charge may go: the overage
-- policy in the context and the credit line's split, draw and repayment
-- (docs/rules.md "Credit line").

-- line_of is the credit line (engine.MutationContext "lim", millicredits)
-- of the customer whose context is ctx: zero when it has none.
local function line_of(ctx)
  local s = string.match(ctx or '', '"lim":(%d+)')
  return (s and m_parse(s)) or MONEY_ZERO
end

-- line_split decides a charge of cost under policy block that frees held
-- (the part of a reservation it settles; zero outside a commit) for account a of
-- effective balance eff and credit line lim: nil when the effective balance
-- would end below minus the line (eff + held - cost < -lim), else what the
-- started blocks pay and what goes on the line as debt. The blocks pay all
-- they have beyond the other reservations (eff + debt + held) before the line is
-- drawn: with no line and no debt it is the plain "cost <= eff + held".
local function line_split(a, eff, held, cost, lim)
  if m_cmp(m_add(m_add(eff, held), lim), cost) < 0 then return nil end
  local free = m_add(m_add(eff, a.d), held)
  if m_cmp(free, cost) >= 0 then return cost, MONEY_ZERO end
  if not m_pos(free) then free = MONEY_ZERO end
  return free, m_sub(cost, free)
end

-- line_draw puts debt on a's credit line and makes consumption entry e
-- (debit_entry's) debit it too: the entry's delta is then minus the whole
-- charge while its draws list what the blocks paid, so the ledger shows the
-- debt (engine.MutationEntry.LineAmount). Returns false on overflow.
local function line_draw(a, e, debt, draws)
  if not m_pos(debt) then return true end
  local d = m_add(a.d, debt)
  if not m_fits(d) then return false end
  a.d = d
  e.delta, e.delta_s = m_sub(e.delta, debt), nil
  e.src, e.block = nil, nil
  if #draws > 0 then e.draws = draws end
  return true
end

-- line_repay pays a's debt from the fresh block b (a grant that starts at
-- once: docs/rules.md "Credit line"), appending the debt_repayment entry: a
-- zero delta (the balance does not move: the debt shrinks as the block
-- does) whose one draw is what b paid.
local function line_repay(a, b, entries, now)
  -- A scoped block never pays it (docs/decisions.md "Credits scoped to
  -- metrics": the line backs every metric, a scope only some).
  if not m_pos(a.d) or b.starts > now or b.scope then return end
  local pay = m_min(a.d, b.rem)
  b.rem, a.d = m_sub(b.rem, pay), m_sub(a.d, pay)
  entries[#entries + 1] = entry_obj({role = 'main', delta_s = '0', type = 'debt_repayment',
    draws = {{b = b, take = pay}}})
end

-- refuses reports whether a customer whose MutationContext is ctx is
-- refused for credit (policy block, the default) rather than charged into
-- overage (allow, notify).
local function refuses(ctx)
  local policy = string.match(ctx or '', '"policy":"(%a+)"') or 'block'
  return policy ~= 'allow' and policy ~= 'notify'
end

-- block_line is the credit line a reservation may lean on: the customer's line
-- (line_of) under policy block, none under allow and notify (they never go
-- below zero: docs/rules.md "Credit line").
local function block_line(ctx)
  if refuses(ctx) then return line_of(ctx) end
  return MONEY_ZERO
end
