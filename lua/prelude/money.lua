-- money.lua owns the money arithmetic and the formatting of integers: every
-- balance, cost and amount goes through it, so rounding and overflow are
-- decided in one place.
--
-- Lua numbers are doubles, exact only to 2^53, while balances are
-- int64 millicredits. A money value is therefore a pair {hi, lo} with
-- value = hi * 1e9 + lo and 0 <= lo < 1e9; both limbs stay far below 2^53, so
-- every addition is exact. Money enters and leaves as decimal strings.

local MONEY_BASE = 1000000000
local MONEY_ZERO = {0, 0}

local function m_norm(hi, lo)
  -- Most sums leave lo in range: no carry, and no math.floor call (a C
  -- call through two table lookups).
  if lo >= 0 and lo < MONEY_BASE then return {hi, lo} end
  local carry = math.floor(lo / MONEY_BASE)
  return {hi + carry, lo - carry * MONEY_BASE}
end

-- m_add and m_sub handle the usual carry of at most one limb themselves
-- (a Lua call and a table cost ~2,000 instructions; m_sub once made three
-- of each); anything else goes through m_norm. Both give m_norm's limbs.
-- A money value is never changed in place, so adding or taking away
-- MONEY_ZERO answers the other value itself, no new table: every sum over
-- the blocks starts at MONEY_ZERO, and most accounts hold nothing reserved
-- and nothing pending (m_parse and m_stored read "0" as MONEY_ZERO).
local function m_add(a, b)
  if a == MONEY_ZERO then return b end
  if b == MONEY_ZERO then return a end
  local hi, lo = a[1] + b[1], a[2] + b[2]
  if lo >= 0 and lo < MONEY_BASE then return {hi, lo} end
  if lo >= MONEY_BASE and lo < 2 * MONEY_BASE then return {hi + 1, lo - MONEY_BASE} end
  return m_norm(hi, lo)
end

local function m_neg(a)
  if a[2] == 0 then return {-a[1], 0} end
  return {-a[1] - 1, MONEY_BASE - a[2]}
end

local function m_sub(a, b)
  if b == MONEY_ZERO then return a end
  local hi, lo = a[1] - b[1], a[2] - b[2]
  if lo >= 0 and lo < MONEY_BASE then return {hi, lo} end
  if lo < 0 and lo >= -MONEY_BASE then return {hi - 1, lo + MONEY_BASE} end
  return m_norm(hi, lo)
end

-- m_cmp is -1, 0 or 1 as a is below, equal to or above b.
local function m_cmp(a, b)
  if a[1] ~= b[1] then return a[1] < b[1] and -1 or 1 end
  if a[2] ~= b[2] then return a[2] < b[2] and -1 or 1 end
  return 0
end

local function m_pos(a) return a[1] > 0 or (a[1] == 0 and a[2] > 0) end

-- m_fits reports whether a is inside int64 (results outside are OVERFLOW).
-- The constants only it reads, and those of now_fmt and m_mul below, are
-- locals of a do block, not of the chunk: the library's chunk stays clear
-- of Lua's 200 locals (prelude.go), and miniredis' Lua counts a chunk's
-- temporaries against the same 200 registers.
local m_fits
do
  -- int64 bounds as limbs: 9223372036854775807 and -9223372036854775808.
  local MONEY_MAX = {9223372036, 854775807}
  local MONEY_MIN = {-9223372037, 145224192}
  function m_fits(a) return m_cmp(a, MONEY_MIN) >= 0 and m_cmp(a, MONEY_MAX) <= 0 end
end

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

-- m_parse reads a decimal int64; nil when s is not one. Up to 15 digits
-- (below 2^53, exact as a double) it splits the number directly: every
-- script parses each block's amounts, so this path is the common one.
local function m_parse(s)
  if s == '0' then return MONEY_ZERO end
  if type(s) ~= 'string' then return nil end
  -- Up to 15 characters, a decimal is exact as a double: a find without
  -- captures, tonumber, and a split only past one limb (floor of a
  -- negative n gives the limbs m_neg would).
  if #s <= 15 and string.find(s, '^%-?%d+$') then
    local n = tonumber(s)
    if n >= 0 and n < MONEY_BASE then return {0, n} end
    local hi = math.floor(n / MONEY_BASE)
    return {hi, n - hi * MONEY_BASE}
  end
  local sign, digits = string.match(s, '^(%-?)(%d+)$')
  if not digits then return nil end
  if #digits <= 15 then
    local n = tonumber(digits)
    local hi = math.floor(n / MONEY_BASE)
    local m = {hi, n - hi * MONEY_BASE}
    if sign == '-' then m = m_neg(m) end
    return m
  end
  digits = (string.gsub(digits, '^0+', ''))
  local n = #digits
  if n > 19 then return nil end
  local m = {0, 0}
  if n > 9 then
    m = {tonumber(string.sub(digits, 1, n - 9)), tonumber(string.sub(digits, n - 8))}
  elseif n > 0 then
    m = {0, tonumber(digits)}
  end
  if sign == '-' then m = m_neg(m) end
  if not m_fits(m) then return nil end
  return m
end

-- MONEY_FAST_HI bounds the high limb of a value whose hi * 1e9 + lo stays
-- below 2^53 in magnitude: such a value is formatted as one double.
local MONEY_FAST_HI = 9000000

-- m_stored reads a decimal this code wrote itself (a hash field): no
-- pattern check, which costs more than the rest of the parse.
local function m_stored(s)
  if s == '0' then return MONEY_ZERO end
  if #s <= 15 then
    local n = tonumber(s)
    if n >= 0 and n < MONEY_BASE then return {0, n} end
    local hi = math.floor(n / MONEY_BASE)
    return {hi, n - hi * MONEY_BASE}
  end
  return m_parse(s)
end

local function m_fmt(m)
  local hi = m[1]
  if hi == 0 and m[2] == 0 then return '0' end
  if hi < MONEY_FAST_HI and hi > -MONEY_FAST_HI then return string.format('%d', hi * MONEY_BASE + m[2]) end
  if m[1] < 0 then return '-' .. m_fmt(m_neg(m)) end
  if m[1] == 0 then return i_fmt(m[2]) end
  local lo = i_fmt(m[2])
  return i_fmt(m[1]) .. string.rep('0', 9 - #lo) .. lo
end

-- m_min is the smaller of a and b.
local function m_min(a, b)
  if m_cmp(a, b) <= 0 then return a end
  return b
end

-- Multiplication. A product of two int64 values reaches 2^126, so the
-- factors are cut into base-1e6 digits: a digit product stays below 1e12
-- and a column sums at most four of them (< 2^53), so every step is exact.
local m_mul
do
  -- MONEY_EXACT is 2^53, the first integer past which doubles skip integers.
  local MONEY_EXACT = 9007199254740992
  local MUL_BASE = 1000000

  -- m_digits6 is non-negative a in base-1e6 digits, least significant first.
  local function m_digits6(a)
    local s, d = m_fmt(a), {}
    local i = #s
    while i >= 1 do
      local j = math.max(1, i - 5)
      d[#d + 1] = tonumber(string.sub(s, j, i))
      i = j - 1
    end
    return d
  end

  -- m_mul is a * b as engine's mulChecked: zero when either factor is zero,
  -- else nil (overflow) when either is negative or the product leaves int64.
  function m_mul(a, b)
    if m_cmp(a, MONEY_ZERO) == 0 or m_cmp(b, MONEY_ZERO) == 0 then return MONEY_ZERO end
    if m_cmp(a, MONEY_ZERO) < 0 or m_cmp(b, MONEY_ZERO) < 0 then return nil end
    -- Both factors below 2^53 and a product below 2^53: the double product
    -- is exact (the true product is representable, and rounding is
    -- monotonic, so a true product at or past 2^53 never reads below it).
    if a[1] < MONEY_FAST_HI and b[1] < MONEY_FAST_HI then
      local x = (a[1] * MONEY_BASE + a[2]) * (b[1] * MONEY_BASE + b[2])
      if x < MONEY_EXACT then
        local hi = math.floor(x / MONEY_BASE)
        return {hi, x - hi * MONEY_BASE}
      end
    end
    local x, y, p = m_digits6(a), m_digits6(b), {}
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
    -- Back to decimal text: m_parse refuses anything past int64.
    local parts = {}
    for k = #p, 1, -1 do
      local d = i_fmt(p[k])
      parts[#parts + 1] = string.rep('0', 6 - #d) .. d
    end
    return m_parse(table.concat(parts))
  end
end
