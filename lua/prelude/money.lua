-- money.lua owns the money arithmetic and the formatting of integers: every
-- balance, cost and amount goes through it, so rounding and overflow are
-- decided in one place.
--
-- Lua numbers are doubles, exact only to 2^53, while balances are int64
-- millicredits. A money value is therefore a Lua number while its magnitude
-- is below 9e15 (under 2^53: every such integer is exact, and so is a sum
-- or product whose result stays below it), and a pair {hi, lo} with value
-- = hi * 1e9 + lo and 0 <= lo < 1e9 past it; both limbs stay far below
-- 2^53, so every limb addition is exact. The form is canonical (m_out): a
-- value below 9e15 is never a pair, so equal numbers are equal values and
-- a pair is never zero. Money enters and leaves as decimal strings.
--
-- Money runs in one of two modes, chosen by the values a call has made.
-- While every value is a number, m_add and the rest are plain arithmetic
-- with a range check: no type test (a global look-up and a C call, which
-- cost more than the pair tables they save) and no table (a pair for every
-- value made ~20 tables a consume, each an allocation and a later sweep:
-- docs/decisions.md "Money as numbers below 9e15"). The first pair a call
-- makes (m_out) switches every m_ function to its general version
-- (MONEY_GENERAL), which takes both forms, for the rest of the call. Each
-- registered function starts back in the number mode (MONEY_GENERAL.numbers,
-- from the wrappers lua/library.go writes), and an EVAL'd script's chunk starts
-- in it.

local MONEY_BASE = 1000000000
local MONEY_ZERO = 0
local m_add, m_sub, m_neg, m_cmp, m_pos, m_fits, m_fmt, m_min, m_mul, m_out, MONEY_GENERAL

-- MONEY_GENERAL holds both modes' versions, and .on while the general
-- ones are in use. The library's memos (terms, blocks, budgets, counters,
-- pools) keep values across calls, so a pair may come back in a later call
-- without m_out: an entry made while .on was set is marked big, and a
-- call that takes a big entry switches as m_out would.
MONEY_GENERAL = {on = false}

-- MONEY_GENERAL.general switches the call to the general versions.
function MONEY_GENERAL.general()
  local g = MONEY_GENERAL
  g.on = true
  m_add, m_sub, m_neg, m_cmp, m_pos, m_fits, m_fmt, m_min, m_mul = g.add, g.sub, g.neg, g.cmp, g.pos, g.fits, g.fmt, g.min, g.mul
end

-- MONEY_GENERAL.numbers starts a call in the number mode.
function MONEY_GENERAL.numbers()
  local g = MONEY_GENERAL
  g.on = false
  m_add, m_sub, m_neg, m_cmp, m_pos, m_fits, m_fmt, m_min, m_mul = g.n_add, g.n_sub, g.n_neg, g.n_cmp, g.n_pos, g.n_fits, g.n_fmt, g.n_min, g.n_mul
end

-- MONEY_GENERAL.limbs is a's limbs, of either form. The quotient of a
-- double near 9e15 by 1e9 may round to the next integer, so lo is brought
-- back into range.
function MONEY_GENERAL.limbs(a)
  if type(a) ~= 'number' then return a[1], a[2] end
  local hi = math.floor(a / MONEY_BASE)
  local lo = a - hi * MONEY_BASE
  if lo < 0 then return hi - 1, lo + MONEY_BASE end
  if lo >= MONEY_BASE then return hi + 1, lo - MONEY_BASE end
  return hi, lo
end

-- m_out is the canonical value of limbs hi, lo (0 <= lo < MONEY_BASE); a
-- pair switches the call to the general versions.
function m_out(hi, lo)
  if hi > -9000002 and hi < 9000000 then
    local v = hi * MONEY_BASE + lo
    if v > -9e15 and v < 9e15 then return v end
  end
  if not MONEY_GENERAL.on then MONEY_GENERAL.general() end
  return {hi, lo}
end

-- The general versions: either form in, the canonical form out.
do
  local g = MONEY_GENERAL

  local function norm(hi, lo)
    if lo >= 0 and lo < MONEY_BASE then return m_out(hi, lo) end
    local carry = math.floor(lo / MONEY_BASE)
    return m_out(hi + carry, lo - carry * MONEY_BASE)
  end

  -- A money value is never changed in place, so adding or taking away
  -- MONEY_ZERO answers the other value itself.
  function g.add(a, b)
    if a == MONEY_ZERO then return b end
    if b == MONEY_ZERO then return a end
    local ah, al = g.limbs(a)
    local bh, bl = g.limbs(b)
    return norm(ah + bh, al + bl)
  end

  function g.sub(a, b)
    if b == MONEY_ZERO then return a end
    local ah, al = g.limbs(a)
    local bh, bl = g.limbs(b)
    return norm(ah - bh, al - bl)
  end

  function g.neg(a)
    if type(a) == 'number' then
      if a == 0 then return 0 end
      return -a
    end
    if a[2] == 0 then return m_out(-a[1], 0) end
    return m_out(-a[1] - 1, MONEY_BASE - a[2])
  end

  -- g.cmp is -1, 0 or 1 as a is below, equal to or above b.
  function g.cmp(a, b)
    local ah, al = g.limbs(a)
    local bh, bl = g.limbs(b)
    if ah ~= bh then return ah < bh and -1 or 1 end
    if al ~= bl then return al < bl and -1 or 1 end
    return 0
  end

  function g.pos(a)
    if type(a) == 'number' then return a > 0 end
    return a[1] > 0 or (a[1] == 0 and a[2] > 0)
  end

  -- g.fits reports whether a is inside int64 (results outside are
  -- OVERFLOW); a number always is. The int64 bounds as limbs:
  -- 9223372036854775807 and -9223372036854775808.
  local MONEY_MAX = {9223372036, 854775807}
  local MONEY_MIN = {-9223372037, 145224192}
  function g.fits(a)
    if type(a) == 'number' then return true end
    return g.cmp(a, MONEY_MIN) >= 0 and g.cmp(a, MONEY_MAX) <= 0
  end

  function g.fmt(m)
    if type(m) == 'number' then
      if m == 0 then return '0' end
      return string.format('%d', m)
    end
    if m[1] < 0 then return '-' .. g.fmt(g.neg(m)) end
    local lo = string.format('%d', m[2])
    return string.format('%d', m[1]) .. string.rep('0', 9 - #lo) .. lo
  end

  function g.min(a, b)
    if g.cmp(a, b) <= 0 then return a end
    return b
  end
end

-- The number versions: every operand is a number below 9e15 in magnitude
-- until m_out makes a pair, so a result past 9e15 (or one the double may
-- have rounded: a true result at or past 2^53 never reads below it) is
-- made again by the general version, which switches the call. Each first
-- asks whether the call switched: Lua fetches a function before its
-- arguments, so m_add(a, m_mul(b, c)) calls the number m_add with the
-- pair m_mul made.
do
  local g = MONEY_GENERAL
  function g.n_add(a, b)
    if g.on then return g.add(a, b) end
    local s = a + b
    if s > -9e15 and s < 9e15 then return s end
    return g.add(a, b)
  end
  function g.n_sub(a, b)
    if g.on then return g.sub(a, b) end
    local s = a - b
    if s > -9e15 and s < 9e15 then return s end
    return g.sub(a, b)
  end
  function g.n_neg(a)
    if g.on then return g.neg(a) end
    if a == 0 then return 0 end
    return -a
  end
  function g.n_cmp(a, b)
    if g.on then return g.cmp(a, b) end
    if a == b then return 0 end
    return a < b and -1 or 1
  end
  function g.n_pos(a)
    if g.on then return g.pos(a) end
    return a > 0
  end
  function g.n_fits(a)
    if g.on then return g.fits(a) end
    return true
  end
  function g.n_fmt(m)
    if g.on then return g.fmt(m) end
    if m == 0 then return '0' end
    return string.format('%d', m)
  end
  function g.n_min(a, b)
    if g.on then return g.min(a, b) end
    if a <= b then return a end
    return b
  end
end

-- g.digits is the value of a text of decimal digits, negated when
-- negative (before the range check: int64's minimum has no positive
-- counterpart); nil outside int64.
do
  local g = MONEY_GENERAL
  function g.digits(text, negative)
    local d = (string.gsub(text, '^0+', ''))
    local n = #d
    if n > 19 then return nil end
    local m
    if n <= 15 then
      m = tonumber(d) or 0
    else
      m = m_out(tonumber(string.sub(d, 1, n - 9)), tonumber(string.sub(d, n - 8)))
    end
    if negative then m = g.neg(m) end
    if not g.fits(m) then return nil end
    return m
  end
end

-- Multiplication. A product of two int64 values reaches 2^126, so the
-- factors are cut into base-1e6 digits: a digit product stays below 1e12
-- and a column sums at most four of them (< 2^53), so every step is exact.
do
  local g = MONEY_GENERAL
  local MUL_BASE = 1000000

  -- digits6 is non-negative a in base-1e6 digits, least significant first.
  local function digits6(a)
    local s, d = g.fmt(a), {}
    local i = #s
    while i >= 1 do
      local j = math.max(1, i - 5)
      d[#d + 1] = tonumber(string.sub(s, j, i))
      i = j - 1
    end
    return d
  end

  -- g.mul is a * b as engine's mulChecked: zero when either factor is
  -- zero, else nil (overflow) when either is negative or the product
  -- leaves int64.
  function g.mul(a, b)
    if a == MONEY_ZERO or b == MONEY_ZERO then return MONEY_ZERO end
    if g.cmp(a, MONEY_ZERO) < 0 or g.cmp(b, MONEY_ZERO) < 0 then return nil end
    local x, y, p = digits6(a), digits6(b), {}
    for k = 1, #x + #y do p[k] = 0 end
    for i = 1, #x do
      for j = 1, #y do p[i + j - 1] = p[i + j - 1] + x[i] * y[j] end
    end
    local carry = 0
    for k = 1, #p do
      local v = p[k] + carry
      carry = math.floor(v / MUL_BASE)
      p[k] = v - carry * MUL_BASE
    end
    -- Back to decimal text: g.digits refuses anything past int64.
    local parts = {}
    for k = #p, 1, -1 do
      local d = string.format('%d', p[k])
      parts[#parts + 1] = string.rep('0', 6 - #d) .. d
    end
    return g.digits(table.concat(parts))
  end

  -- g.n_mul: two numbers whose double product is below 9e15 make an exact
  -- product (a true product at or past 2^53 never rounds below it).
  function g.n_mul(a, b)
    if g.on then return g.mul(a, b) end
    if a == 0 or b == 0 then return 0 end
    if a < 0 or b < 0 then return nil end
    local x = a * b
    if x < 9e15 then return x end
    return g.mul(a, b)
  end
end

MONEY_GENERAL.numbers()

-- i_fmt formats an integral double below 2^53 exactly (tostring would use
-- %.14g); '%d' goes through a C long, cheaper than '%.0f'.
local function i_fmt(n) return string.format('%d', n) end

-- now_fmt is i_fmt of a script's now, which it writes several times (the
-- account's "ua", the Mutation's "at", an op record): sprintf costs ~2,500
-- instructions, so the last text is remembered (in the library, across
-- calls: consecutive calls often share the millisecond).
local now_fmt
do
  local NOW_N, NOW_S = nil, nil
  function now_fmt(n)
    if n ~= NOW_N then NOW_N, NOW_S = n, string.format('%d', n) end
    return NOW_S
  end
end

-- m_parse reads a decimal int64; nil when s is not one. Up to 15
-- characters (below 2^53, exact as a double) the number is the value: every
-- script parses each block's amounts, so this path is the common one.
local function m_parse(s)
  if s == '0' then return MONEY_ZERO end
  if type(s) ~= 'string' then return nil end
  if #s <= 15 and string.find(s, '^%-?%d+$') then
    local n = tonumber(s)
    if n == 0 then return MONEY_ZERO end -- "-0"
    return n
  end
  local sign, digits = string.match(s, '^(%-?)(%d+)$')
  if not digits then return nil end
  return MONEY_GENERAL.digits(digits, sign == '-')
end

-- m_stored reads a decimal this code wrote itself (a hash field): no
-- pattern check, which costs more than the rest of the parse.
local function m_stored(s)
  if s == '0' then return MONEY_ZERO end
  if #s <= 15 then return tonumber(s) end
  return m_parse(s)
end

