-- text.lua owns the small text codes every encoding shares (integral
-- ARGVs, base 36, the one-letter sources, JSON strings), so the hash
-- encodings and the Mutation JSON spell them alike.

-- int_parse reads an integral ARGV (ms, versions, priorities); nil if not one.
local function int_parse(s)
  if type(s) ~= 'string' or not string.find(s, '^%-?%d+$') then return nil end
  return tonumber(s)
end

-- b36_enc is integer n in base 36, lower case. The digits go to one
-- string.char as bytes: a concatenation per digit made a new string
-- (hashed byte by byte) each time, ~7,000 instructions an instant, and a
-- reservation's create encodes two (docs/decisions.md "Base 36 in one
-- string"). They are written into one scratch table of the library from
-- its end, the highest digit last written: a table made per call grew
-- past a power of two three times, and its digits were reversed in a loop
-- (5 % of a reservation's Lua instructions). Scripts never run at once,
-- and string.char reads the digits before any other call can.
local b36_enc
do
  -- 13 digits hold any int64 (36^13 > 2^63).
  local B36_END = 13
  local B36_DIGITS = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}
  function b36_enc(n)
    if n == 0 then return '0' end
    local sign = nil
    if n < 0 then sign, n = '-', -n end
    local c, i = B36_DIGITS, B36_END
    while n > 0 do
      local d = n % 36
      if d < 10 then c[i] = d + 48 else c[i] = d + 87 end
      i = i - 1
      n = (n - d) / 36
    end
    if sign then return sign .. string.char(unpack(c, i + 1, B36_END)) end
    return string.char(unpack(c, i + 1, B36_END))
  end
end

local function b36_dec(s)
  if string.byte(s, 1) == 45 then return -tonumber(string.sub(s, 2), 36) end -- '-'
  return tonumber(s, 36)
end

-- Known sources are stored as one letter; anything else as its text (always
-- longer than one letter, so the two never collide).
local SOURCE_CODE = {plan_grant = 'p', topup = 't', promotional = 'o', compensation = 'c',
  referral = 'r', manual = 'm', migration = 'g'}
-- SOURCE_NAME inverts SOURCE_CODE, written out: a loop at the top level
-- would run on every call.
local SOURCE_NAME = {p = 'plan_grant', t = 'topup', o = 'promotional', c = 'compensation',
  r = 'referral', m = 'manual', g = 'migration'}

local function src_enc(s) return SOURCE_CODE[s] or s end
local function src_dec(s) return SOURCE_NAME[s] or s end

-- q quotes text that needs no JSON escaping: UUIDs, enums and hex hashes
-- that Go formatted (j_str's pattern costs ~10,000 instructions a call).
local function q(s) return '"' .. s .. '"' end

-- j_str encodes a short trusted string (ids, enums, hashes) as JSON text;
-- client text arrives pre-encoded by Go instead.
local function j_str(s)
  -- Keys and ids rarely hold a character to escape: a find is a third of
  -- the gsub's cost.
  if not string.find(s, '[%c"\\]') then return '"' .. s .. '"' end
  return '"' .. (string.gsub(s, '[%c"\\]', function(c)
    if c == '"' then return '\\"' end
    if c == '\\' then return '\\\\' end
    return string.format('\\u%04x', string.byte(c))
  end)) .. '"'
end

-- src_json is source s as JSON text (known sources need no escaping).
local function src_json(s)
  if SOURCE_CODE[s] then return '"' .. s .. '"' end
  return j_str(s)
end
