-- spend_order.lua owns which blocks count and pay (live, started, applying
-- to a metric) and in which order they pay (engine.SpendOrder), so the
-- balances, the drains and the spend-order index agree.

-- live: the block has credit and has not reached expires_at (a block stops
-- counting at that very instant), as engine.MutationBlock.Live. Every
-- block of an account is asked a few times a call: in the number mode
-- (prelude/money.lua) its amount is compared as it is, no m_pos call.
local function live(b, now)
  local r = b.rem
  if MONEY_GENERAL.on then
    if not m_pos(r) then return false end
  elseif r <= 0 then
    return false
  end
  return b.expires == nil or b.expires > now
end

-- started: the block may be spent (stack_after blocks wait for their start).
local function started(b, now) return b.starts <= now end

-- str_less compares bytes, as Go does; Lua's < follows the server's locale.
local function str_less(a, b)
  local n = math.min(#a, #b)
  for i = 1, n do
    local x, y = string.byte(a, i), string.byte(b, i)
    if x ~= y then return x < y end
  end
  return #a < #b
end

-- spends_before is engine.SpendOrder: priority asc, then soonest expiry (no
-- expiry last), then oldest, then id.
local function spends_before(a, b)
  if a.prio ~= b.prio then return a.prio < b.prio end
  if a.expires and not b.expires then return true end
  if b.expires and not a.expires then return false end
  if a.expires and a.expires ~= b.expires then return a.expires < b.expires end
  if a.created ~= b.created then return a.created < b.created end
  return str_less(a.id, b.id)
end

-- balances sums live blocks at now as engine.ComputeBalances: balance,
-- pending (not started) and effective = balance - reserved - pending.
local function balances(blocks, reserved, now)
  local bal, pend = MONEY_ZERO, MONEY_ZERO
  for _, b in ipairs(blocks) do
    if live(b, now) then
      bal = m_add(bal, b.rem)
      if b.starts > now then pend = m_add(pend, b.rem) end
    end
  end
  return bal, pend, m_sub(m_sub(bal, reserved), pend)
end

-- scope_keys is the set of metric keys of scoped block b, parsed once per
-- script (kept on b): a charge asks each block about every reservation metric.
local function scope_keys(b)
  local set = b.keyset
  if not set then
    set = {}
    for k in string.gmatch(b.scope, '[^,]+') do set[k] = true end
    b.keyset = set
  end
  return set
end

-- applies: block b pays for metric (never for "", a multi-metric reservation).
local function applies(b, metric)
  return b.scope == nil or scope_keys(b)[metric] == true
end
