-- prelude.lua is concatenated in front of every money/state script (see
-- scripts.go), so the scripts share one definition of money arithmetic, of
-- the block encoding and of the Mutation JSON. It only defines locals: Redis
-- forbids globals in scripts.
--
-- Money: Lua numbers are doubles, exact only to 2^53, while balances are
-- int64 millicredits. A money value is therefore a pair {hi, lo} with
-- value = hi * 1e9 + lo and 0 <= lo < 1e9; both limbs stay far below 2^53, so
-- every addition is exact. Money enters and leaves as decimal strings.
--
-- Block encoding (the value of field "b:<block id>" of the account hash),
-- seven fields joined by "|":
--   remaining|original|priority|created|starts-created|expires-starts|source
-- money in decimal, original "" while it equals remaining (an untouched
-- block); instants in Unix ms written in base 36 to save memory (created
-- absolute, starts as an offset from created, "" for 0; expires as an offset
-- from starts, "" for no expiry); source as a one-letter code for the known
-- sources (else the text). Older hashes wrote original always and an eighth
-- field, meta (once the block's metadata JSON, later ""), after one more
-- "|": both are still read, and a block read with its metadata inline gets
-- the current encoding when written back. A block scoped to metrics
-- (docs/rules.md "Credits scoped to metrics") has an eighth field "@"
-- followed by its metric keys joined by "," (keys never hold "|", ",", "@":
-- engine.ValidMetricKey), which the old meta field never starts with.
--
-- Ids in field names, in the spend-order index and in field "id" are
-- whatever Go handed the script: the 22-character compact form of
-- engine.CompactID (older hashes: UUID text). Scripts never look inside an
-- id; Go reads both forms back (engine.ParseStoredID). Three blocks and the
-- account fields fit in one 224-byte listpack (issue 10).
--
-- Block metadata lives in its own field "m:<block id>" of the account hash,
-- written once when the block is created and deleted with the block. Every
-- script reads the hash without those fields (acct_read), so a customer's
-- metadata costs a money script nothing (invariant 13), and only the
-- Mutation of the script that creates a block carries its metadata: a drain
-- never copies it into the outbox or an op key.
--
-- An account of 8 or more blocks and active holds also keeps a summary, a
-- spend-order index and its kept-hold list (fields "s", "o", "k"; see
-- "Account layout v2" below), so a money script reads only the blocks it
-- drains.
--
-- Bounds (invariant 13, docs/limits.md): a customer holds at most
-- MAX_LIVE_BLOCKS live blocks and MAX_ACTIVE_HOLDS active holds; a script
-- that would create one more refuses with TOOMANYBLOCKS or TOOMANYHOLDS and
-- changes nothing. engine.MaxLiveBlocks and engine.MaxActiveHolds mirror
-- them (a test keeps the pairs equal).
local MAX_LIVE_BLOCKS = 100
local MAX_ACTIVE_HOLDS = 100
-- At most MAX_KEPT_HOLDS finalized holds stay in the hash for their
-- RES_KEEP_MS; past that the oldest leave early (engine then reads their
-- final status from Postgres, as after RES_KEEP_MS).
local MAX_KEPT_HOLDS = 8

local MONEY_BASE = 1000000000
local MONEY_ZERO = {0, 0}
-- int64 bounds as limbs: 9223372036854775807 and -9223372036854775808.
local MONEY_MAX = {9223372036, 854775807}
local MONEY_MIN = {-9223372037, 145224192}

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
local function m_add(a, b)
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
local function m_fits(a) return m_cmp(a, MONEY_MIN) >= 0 and m_cmp(a, MONEY_MAX) <= 0 end

-- i_fmt formats an integral double below 2^53 exactly (tostring would use
-- %.14g); '%d' goes through a C long, cheaper than '%.0f'.
local function i_fmt(n) return string.format('%d', n) end

-- now_fmt is i_fmt of a script's now, which it writes several times (the
-- account's "ua", the Mutation's "at", an op record): sprintf costs ~2,500
-- instructions, so the last text is remembered (in the library, across
-- calls: consecutive calls often share the millisecond).
local NOW_N, NOW_S = nil, nil
local function now_fmt(n)
  if n ~= NOW_N then NOW_N, NOW_S = n, string.format('%d', n) end
  return NOW_S
end

-- m_parse reads a decimal int64; nil when s is not one. Up to 15 digits
-- (below 2^53, exact as a double) it splits the number directly: every
-- script parses each block's amounts, so this path is the common one.
local function m_parse(s)
  if s == '0' then return {0, 0} end
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
-- MONEY_EXACT is 2^53, the first integer past which doubles skip integers.
local MONEY_EXACT = 9007199254740992

-- m_stored reads a decimal this code wrote itself (a hash field): no
-- pattern check, which costs more than the rest of the parse.
local function m_stored(s)
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
local function m_mul(a, b)
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

-- Pricing terms, as lua.termsArg encodes an engine.RuleTerms:
--   cost_type|base_cost|unit_cost|mode|tiers
-- tiers are "up_to:unit_cost:flat_cost" joined by ",", up_to "" for null.
local function terms_parse(s)
  if type(s) ~= 'string' then return nil end
  -- One match for the five fields (a gmatch built a table of them).
  local f = {string.match(s, '^([^|]*)|([^|]*)|([^|]*)|([^|]*)|([^|]*)$')}
  if #f ~= 5 then return nil end
  local t = {kind = f[1], base = m_parse(f[2]), unit = m_parse(f[3]), mode = f[4], tiers = {}}
  if not t.base or not t.unit then return nil end
  if f[5] ~= '' then
    for tier in string.gmatch(f[5] .. ',', '([^,]*),') do
      local up, unit, flat = string.match(tier, '^([^:]*):([^:]*):([^:]*)$')
      if not up then return nil end
      local x = {upto = nil, unit = m_parse(unit), flat = m_parse(flat)}
      if up ~= '' then
        x.upto = m_parse(up)
        if not x.upto then return nil end
      end
      if not x.unit or not x.flat then return nil end
      t.tiers[#t.tiers + 1] = x
    end
  end
  return t
end

-- terms_cached is terms_parse(s), remembered per text in the library
-- (a consume's terms are usually the ones of the call before): the
-- result is only read. At most TERMS_CACHE_MAX texts are kept.
local TERMS_CACHE, TERMS_CACHED, TERMS_CACHE_MAX = {}, 0, 64
local function terms_cached(s)
  local t = TERMS_CACHE[s]
  if t then return t end
  t = terms_parse(s)
  if t and type(s) == 'string' then
    if TERMS_CACHED >= TERMS_CACHE_MAX then TERMS_CACHE, TERMS_CACHED = {}, 0 end
    TERMS_CACHE[s], TERMS_CACHED = t, TERMS_CACHED + 1
  end
  return t
end

local MONEY_ONE = {0, 1}
local PRICE_OVERFLOW = 'OVERFLOW the cost would not fit in int64'

-- price is engine.Price of units under terms t: flat charges base_cost per
-- call; per_unit unit_cost x units; tiered graduated prices each tier's
-- slice plus the flat_cost of every tier reached; tiered volume prices
-- every unit at the first tier whose up_to (inclusive) holds the total,
-- plus that tier's flat_cost. It returns the cost, or nil and an error
-- reply text (OVERFLOW when the cost leaves int64, as Go refuses it).
local function price(t, units)
  if m_cmp(units, MONEY_ONE) < 0 then return nil, 'BADARG units must be >= 1' end
  if t.kind == 'flat' then return t.base end
  if t.kind == 'per_unit' then
    local c = m_mul(t.unit, units)
    if not c then return nil, PRICE_OVERFLOW end
    return c
  end
  if t.kind ~= 'tiered' or #t.tiers == 0 then return nil, 'BADTERMS no price for these terms' end
  if t.mode == 'volume' then
    local tier = t.tiers[#t.tiers]
    for _, cand in ipairs(t.tiers) do
      if cand.upto == nil or m_cmp(units, cand.upto) <= 0 then
        tier = cand
        break
      end
    end
    local c = m_mul(tier.unit, units)
    if not c then return nil, PRICE_OVERFLOW end
    c = m_add(c, tier.flat)
    if not m_fits(c) then return nil, PRICE_OVERFLOW end
    return c
  end
  local total, below = MONEY_ZERO, MONEY_ZERO
  for _, tier in ipairs(t.tiers) do
    if m_cmp(units, below) <= 0 then break end
    local top = units
    if tier.upto and m_cmp(tier.upto, units) < 0 then top = tier.upto end
    local slice = m_sub(top, below)
    if m_pos(slice) then
      local c = m_mul(tier.unit, slice)
      if not c then return nil, PRICE_OVERFLOW end
      total = m_add(total, c)
      if not m_fits(total) then return nil, PRICE_OVERFLOW end
      total = m_add(total, tier.flat)
      if not m_fits(total) then return nil, PRICE_OVERFLOW end
      below = top
    end
  end
  return total
end

-- int_parse reads an integral ARGV (ms, versions, priorities); nil if not one.
local function int_parse(s)
  if type(s) ~= 'string' or not string.find(s, '^%-?%d+$') then return nil end
  return tonumber(s)
end

local B36 = '0123456789abcdefghijklmnopqrstuvwxyz'

local function b36_enc(n)
  if n == 0 then return '0' end
  local sign = ''
  if n < 0 then sign, n = '-', -n end
  local out = ''
  while n > 0 do
    local d = n % 36
    out = string.sub(B36, d + 1, d + 1) .. out
    n = (n - d) / 36
  end
  return sign .. out
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

-- items_price prices every item ({metric, units, terms}) of a
-- multi-metric call (setting each one's cost) and sums their units and costs; items_j lists them as
-- JSON objects, each with its metric, its units under units_name and its
-- cost under cost_name. Instead (fourth value) the error reply when a
-- price fails or a sum leaves int64.
local function items_price(items, units_name, cost_name)
  local cost, units, parts = MONEY_ZERO, MONEY_ZERO, {}
  for i, it in ipairs(items) do
    local c, err = price(it.terms, it.units)
    if not c then return nil, nil, nil, redis.error_reply(err) end
    cost, units = m_add(cost, c), m_add(units, it.units)
    it.cost = c
    if not m_fits(cost) or not m_fits(units) then return nil, nil, nil, redis.error_reply(PRICE_OVERFLOW) end
    parts[i] = '{"billable_metric_key":' .. j_str(it.metric) .. ',"' .. units_name .. '":' .. m_fmt(it.units) ..
      ',"' .. cost_name .. '":' .. m_fmt(c) .. '}'
  end
  return cost, units, '[' .. table.concat(parts, ',') .. ']'
end

-- src_json is source s as JSON text (known sources need no escaping).
local function src_json(s)
  if SOURCE_CODE[s] then return '"' .. s .. '"' end
  return j_str(s)
end

-- scope_field is the eighth block field of scope s (",k1,k2," as blocks
-- keep it, nil for every metric): "|@k1,k2", or "".
local function scope_field(s)
  if not s then return '' end
  return '|@' .. string.sub(s, 2, -2)
end

-- block_enc is the hash value of block b (format above).
local function block_enc(b)
  -- A drain changes only the remaining amount: the rest of a block read
  -- from the hash is written back as it was read (b36_enc is a Lua loop).
  -- Original is written out exactly when it differs from remaining (strings
  -- are interned: == is one comparison).
  local rem = m_fmt(b.rem)
  -- Kept for block_json (b_rem_s), which writes the same amount next.
  b.rem_s, b.rem_k = rem, b.rem
  if b.raw then
    if b.orig_len == 0 then
      if rem == b.orig_s then return b.raw end
      return rem .. '|' .. b.orig_s .. string.sub(b.raw, b.rem_len + 2)
    end
    if rem == b.orig_s then return rem .. '|' .. string.sub(b.raw, b.rem_len + 2 + b.orig_len) end
    return rem .. string.sub(b.raw, b.rem_len + 1)
  end
  local exp = ''
  if b.expires then exp = b36_enc(b.expires - b.starts) end
  local st = ''
  if b.starts ~= b.created then st = b36_enc(b.starts - b.created) end
  local orig = b.orig_s or m_fmt(b.orig)
  if orig == rem then orig = '' end
  return rem .. '|' .. orig .. '|' .. i_fmt(b.prio) .. '|' .. b36_enc(b.created) ..
    '|' .. st .. '|' .. exp .. '|' .. src_enc(b.src) .. scope_field(b.scope)
end

-- block_dec reads the block id stored as raw.
local function block_dec(id, raw)
  -- One match for all fields: every script decodes every block. rest is ""
  -- (the current encoding), "|" or "|" and inline metadata (older hashes).
  local rem, orig, prio, c36, s36, e36, src, rest =
    string.match(raw, '^([^|]*)|([^|]*)|([^|]*)|([^|]*)|([^|]*)|([^|]*)|([^|]*)(.*)$')
  local meta, scope = '', nil
  if rest ~= '' then
    -- "|@keys": the block's scope, kept as ",k1,k2," (applies finds
    -- ",key," in it); else an older hash's inline metadata.
    if string.byte(rest, 2) == 64 then scope = ',' .. string.sub(rest, 3) .. ',' else meta = string.sub(rest, 2) end
  end
  local created = b36_dec(c36)
  local starts = created
  if s36 ~= '' then starts = created + b36_dec(s36) end
  local expires = nil
  if e36 ~= '' then expires = starts + b36_dec(e36) end
  -- raw: block_enc writes the encoding after the amounts back as read
  -- (meta "" only: an older hash's inline metadata moves to its own field).
  -- The original amount stays text (orig_s, remaining's text when it is
  -- not written out): no script does arithmetic on it.
  local orig_s = orig
  if orig == '' then orig_s = rem end
  -- A one-digit priority (the usual) is read from its byte: tonumber
  -- goes through strtod (~2,400 instructions). prio_s keeps that text
  -- (one digit: as i_fmt writes it) for block_json.
  local p, prio_s = string.byte(prio), nil
  if #prio == 1 and p >= 48 and p <= 57 then p, prio_s = p - 48, prio else p = tonumber(prio) end
  -- Members set later (drain, block_enc) are named (nil): the table is
  -- made at its final size.
  local b = {id = id, rem = m_stored(rem), orig_s = orig_s, prio = p, prio_s = prio_s,
    created = created, starts = starts, expires = expires, src = src_dec(src), meta = meta, scope = scope,
    raw = nil, rem_len = nil, orig_len = nil, rem0 = nil, ix = nil, rem_s = nil, rem_k = nil}
  if meta == '' then b.raw, b.rem_len, b.orig_len = raw, #rem, #orig end
  return b
end

-- block_json is b as an engine.MutationBlock; only a block created by this
-- script (b.fresh) carries its metadata: the persister keeps the metadata
-- Postgres has for a block whose Mutation carries none.
-- Text a block already carries is used as is: its remaining amount as
-- block_enc wrote it, its priority as read, and its instants as the
-- spend-order index wrote them (drain's fast path), each while the value
-- it stands for is unchanged.
local function block_json(b)
  local exp = 'null'
  local ix = b.ix
  if b.expires then exp = (ix and ix[2] == b.expires and ix[1]) or i_fmt(b.expires) end
  local rem = (b.rem_k == b.rem and b.rem_s) or m_fmt(b.rem)
  local prio = b.prio_s or i_fmt(b.prio)
  local starts = (ix and ix[4] == b.starts and ix[3]) or i_fmt(b.starts)
  local created = i_fmt(b.created)
  local meta = ''
  if b.fresh and b.meta ~= '' then meta = ',"meta":' .. b.meta end
  -- The scope never changes: only the Mutation creating the block names
  -- it (keys need no escaping: engine.ValidMetricKey).
  if b.fresh and b.scope then
    meta = meta .. ',"scope":["' .. string.gsub(string.sub(b.scope, 2, -2), ',', '","') .. '"]'
  end
  return '{"id":"' .. b.id .. '","original":' .. (b.orig_s or m_fmt(b.orig)) .. ',"remaining":' .. rem ..
    ',"priority":' .. prio .. ',"source":' .. src_json(b.src) .. ',"starts":' .. starts ..
    ',"expires":' .. exp .. ',"created":' .. created .. meta .. '}'
end

-- entry_json is one engine.MutationEntry; reason and meta are JSON text or ''.
local function entry_json(role, delta, typ, src, block_id, reason, meta)
  local s = '{"role":"' .. role .. '","delta":' .. m_fmt(delta) .. ',"type":' .. q(typ) ..
    ',"source":' .. src_json(src) .. ',"block":' .. q(block_id)
  if reason ~= '' then s = s .. ',"reason":' .. reason end
  if meta ~= '' then s = s .. ',"meta":' .. meta end
  return s .. '}'
end

-- entry_obj is one engine.MutationEntry from the table e: role, delta
-- (money, or delta_s: its text) and type, and optionally src and block (null when absent), metric,
-- units (money), ref, overage (money), reason, meta (JSON text or '') and
-- open.
local function entry_obj(e)
  -- Each optional member is '' when absent, so the entry is one
  -- concatenation (each s = s .. x copied the entry so far).
  local metric, units, ref, overage, reason, meta, draws = '', '', '', '', '', '', ''
  if e.metric_j then metric = ',"metric":' .. e.metric_j elseif e.metric then metric = ',"metric":' .. j_str(e.metric) end
  if e.units_s then units = ',"units":' .. e.units_s elseif e.units then units = ',"units":' .. m_fmt(e.units) end
  if e.ref then ref = ',"ref":"' .. e.ref .. '"' end
  if e.overage then overage = ',"overage":' .. m_fmt(e.overage) end
  if e.reason and e.reason ~= '' then reason = ',"reason":' .. e.reason end
  if e.meta and e.meta ~= '' and not e.open then meta = ',"meta":' .. e.meta end
  if e.draws then
    local d = {}
    for i, x in ipairs(e.draws) do d[i] = '{"b":"' .. x.b.id .. '","d":' .. m_fmt(x.take) .. '}' end
    draws = ',"draws":[' .. table.concat(d, ',') .. ']'
  end
  local block = 'null'
  if e.block then block = '"' .. e.block .. '"' end
  -- open: the last entry of a Mutation, left open for mutation_json to
  -- splice its metadata (m.open_meta) into its one concatenation.
  return '{"role":"' .. e.role .. '","delta":' .. (e.delta_s or m_fmt(e.delta)) .. ',"type":"' .. e.type ..
    '","source":' .. (e.src and src_json(e.src) or 'null') .. ',"block":' .. block .. metric .. units .. ref ..
    overage .. reason .. meta .. draws .. (e.open and '' or '}')
end

-- debit_entry fills the consumption entry e (an entry_obj table) from the
-- draws of one drain: ONE ledger entry per charge (docs/spec/interface.md: a consume,
-- a commit and a usage event write one debit). Its delta is minus the
-- total drawn; it names the block and its source when one block paid, and
-- lists what each block paid (engine.EntryDraw) when several did.
local function debit_entry(e, draws)
  local total = MONEY_ZERO
  for _, d in ipairs(draws) do total = m_add(total, d.take) end
  e.delta = m_neg(total)
  if #draws == 1 then
    e.src, e.block = draws[1].b.src, draws[1].b.id
  elseif #draws > 1 then
    e.draws = draws
  end
  return e
end

-- usage_json_s is an engine.MutationUsage from its members already
-- formatted (the metric as JSON text, money in decimal), so a script that
-- also writes them elsewhere formats each once; res_id is nil outside a
-- commit.
local function usage_json_s(metric_j, units, cost, charged, overage, refused, res_id)
  local s = '{"metric":' .. metric_j .. ',"units":' .. units .. ',"cost":' .. cost ..
    ',"charged":' .. charged .. ',"overage":' .. overage
  if refused then s = s .. ',"refused":true' end
  if res_id then s = s .. ',"reservation":' .. q(res_id) end
  return s .. '}'
end

-- usage_json is an engine.MutationUsage; res_id is nil outside a commit.
local function usage_json(metric, units, cost, charged, overage, refused, res_id)
  return usage_json_s(j_str(metric), m_fmt(units), m_fmt(cost), m_fmt(charged), m_fmt(overage), refused, res_id)
end

-- Reservation encoding (the value of field "r:<reservation id>"), eleven
-- fields joined by "|", the last one free text:
--   status|est units|est cost|expires|created|finalized|actual units|actual cost|released|metric|meta
-- status one letter (a active, c committed, r released, e expired); money
-- and units in decimal; instants in Unix ms base 36 (finalized "" while
-- active); actual units and cost "" until committed or partially
-- committed (while active: the units and cost settled so far; once
-- committed: the totals of every part); released, while active, the part
-- of est cost partial commits took from the hold (0 without one), once
-- finalized the money the final commit, release or expiry returned; metric a metric key (never holds "|"); meta "" (older
-- hashes kept the metadata JSON here; it is still read): a hold's metadata
-- lives in field "n:<reservation id>", which acct_read skips like block
-- metadata. A finalized reservation stays RES_KEEP_MS,
-- so a quick second commit or release answers 409 without Postgres; after
-- that the engine reads the final status from Postgres. Kept short: every
-- script on the account reads every field of its hash.
local RES_KEEP_MS = 10 * 60 * 1000
local RES_CODE = {active = 'a', committed = 'c', released = 'r', expired = 'e'}
local RES_NAME = {a = 'active', c = 'committed', r = 'released', e = 'expired'}

-- A hold table r carries, beside its values, text already at hand for
-- them (res_txt): t.<name> is the text of r.<name> while k.<name> is that
-- same value (a script that replaces the value leaves a stale text
-- unused). res_dec keeps the stored texts, the scripts add the texts Go
-- sent, so each number is parsed and formatted at most once: tonumber or
-- sprintf cost ~2,500 instructions, b36_enc a Lua loop.
local function res_txt(r, name, fmt)
  local v, k = r[name], r.k
  -- A hold table without texts (k nil) is formatted every time.
  if not k then return fmt(v) end
  if k[name] == v then return r.t[name] end
  local s = fmt(v)
  r.t[name], k[name] = s, v
  return s
end

-- res_set records s as the text of r.<name> (its value already set).
local function res_set(r, name, s)
  if s and r.k then r.t[name], r.k[name] = s, r[name] end
end

-- arg_txt is Go's decimal text s of the value v when it is already what
-- m_fmt or i_fmt would write (no leading zero or sign: Go formats with
-- strconv), else nil.
local function arg_txt(s)
  local c = string.byte(s, 1)
  if c and c > 48 and c <= 57 then return s end
  return nil
end

-- B36_N, B36_S: the last instant b36_enc wrote for res_enc (a hold's
-- created and finalized instants are its script's now).
local B36_N, B36_S = nil, nil
local function now_b36(n)
  if n ~= B36_N then B36_N, B36_S = n, b36_enc(n) end
  return B36_S
end

local function res_dec(id, raw)
  local p, pos = {}, 1
  for i = 1, 10 do
    local j = string.find(raw, '|', pos, true)
    p[i] = string.sub(raw, pos, j - 1)
    pos = j + 1
  end
  local eu, ec, ex, cr, rel = m_parse(p[2]), m_parse(p[3]), b36_dec(p[4]), b36_dec(p[5]), m_parse(p[9])
  local r = {id = id, status = RES_NAME[p[1]], est_units = eu, est_cost = ec,
    expires = ex, created = cr, released = rel, metric = p[10],
    meta = string.sub(raw, pos), final = nil, act_units = nil, act_cost = nil, items = nil, meta_n = nil,
    -- The stored texts (res_txt): decimal for money, base 36 (x36, c36)
    -- for instants.
    t = {est_units = p[2], est_cost = p[3], x36 = p[4], c36 = p[5], released = p[9]},
    k = {est_units = eu, est_cost = ec, x36 = ex, c36 = cr, released = rel}}
  if p[6] ~= '' then r.final = b36_dec(p[6]) end
  if p[7] ~= '' then r.act_units = m_parse(p[7]) end
  if p[8] ~= '' then r.act_cost = m_parse(p[8]) end
  return r
end

-- res_b36 is the base-36 text of instant r.<name> for res_enc: as stored
-- while unchanged (t[key]), or the script's now from its cache.
local function res_b36(r, name, key)
  local v = r[name]
  if r.k and r.k[key] == v then return r.t[key] end
  return now_b36(v)
end

local function res_enc(r)
  local final, au, ac = '', '', ''
  if r.final then final = now_b36(r.final) end
  if r.act_units then au = res_txt(r, 'act_units', m_fmt) end
  if r.act_cost then ac = res_txt(r, 'act_cost', m_fmt) end
  -- released is usually zero while active and est_cost once finalized.
  local rel
  if r.released == r.est_cost then rel = res_txt(r, 'est_cost', m_fmt) else rel = res_txt(r, 'released', m_fmt) end
  return RES_CODE[r.status] .. '|' .. res_txt(r, 'est_units', m_fmt) .. '|' .. res_txt(r, 'est_cost', m_fmt) .. '|' ..
    res_b36(r, 'expires', 'x36') .. '|' .. res_b36(r, 'created', 'c36') .. '|' .. final .. '|' .. au .. '|' .. ac .. '|' ..
    rel .. '|' .. r.metric .. '|'
end

-- res_get decodes the hold id stored as raw with its metadata (field
-- "n:<id>", which acct_read read as an extra, or inline in an older hash).
local function res_get(a, id, raw)
  local r = res_dec(id, raw)
  if r.meta == '' then
    r.meta = a.x['n:' .. id] or ''
    -- As field "n:<id>" holds it: res_put does not write it back unchanged.
    r.meta_n = r.meta
  end
  return r
end

-- res_put stores hold r in a, to be written by acct_commit with its
-- metadata.
local function res_put(a, r)
  -- Metadata as field "n:<id>" already holds it (res_get) is not written
  -- again: a commit without metadata would copy every byte of it.
  local meta = r.meta
  if meta == r.meta_n then meta = '' end
  a.res[r.id], a.res_dirty[r.id], a.res_meta[r.id] = res_enc(r), true, meta
  -- Every res_put either opens a hold (reserve) or finalizes an active
  -- one (commit, release): the active count and the kept list follow.
  if r.status == 'active' then
    a.active = a.active + 1
  else
    a.active = a.active - 1
    a.kept[#a.kept + 1] = {r.id, r.final}
    a.kept_moved = true
  end
end

-- res_update stores active hold r in a again after an extend or a partial
-- commit: it stays active, so the active count and the kept list stay.
local function res_update(a, r)
  local meta = r.meta
  if meta == r.meta_n then meta = '' end
  a.res[r.id], a.res_dirty[r.id], a.res_meta[r.id] = res_enc(r), true, meta
end

-- res_held is what active hold r still holds: its estimated cost less what
-- partial commits took from it (r.released while active, see res_enc).
local function res_held(r)
  if m_pos(r.released) then return m_sub(r.est_cost, r.released) end
  return r.est_cost
end

-- res_json_head is r as an engine.MutationReservation but its metadata and
-- closing brace, which mutation_json splices in (m.res): every copy of a
-- long string costs Redis's Lua a hash of all its bytes (~4 ns a byte).
local function res_json_head(r)
  -- One concatenation; each number's text from res_txt (formatted once
  -- for the hash and this), the finalized instant is the script's now.
  local au, ac, fin, items = '', '', '', ''
  if r.act_units then au = ',"act_units":' .. res_txt(r, 'act_units', m_fmt) end
  if r.act_cost then ac = ',"act_cost":' .. res_txt(r, 'act_cost', m_fmt) end
  if r.final then
    fin = (r.status == 'committed' and ',"committed":' or ',"released_at":') .. now_fmt(r.final)
  end
  local rel
  if r.released == r.est_cost then rel = res_txt(r, 'est_cost', m_fmt) else rel = res_txt(r, 'released', m_fmt) end
  -- A multi-metric hold's item list (JSON text), set by reserve_multi.lua
  -- and commit_multi.lua only: Redis does not store it.
  if r.items then items = ',"items":' .. r.items end
  return '{"id":"' .. r.id .. '","metric":' .. j_str(r.metric) .. ',"est_units":' .. res_txt(r, 'est_units', m_fmt) ..
    ',"est_cost":' .. res_txt(r, 'est_cost', m_fmt) .. au .. ac .. ',"released":' .. rel ..
    ',"status":"' .. r.status .. '","expires":' .. res_txt(r, 'expires', i_fmt) ..
    ',"created":' .. res_txt(r, 'created', i_fmt) .. fin .. items
end

-- res_final is when the encoded reservation was finalized (ms), nil while
-- it is active: one pattern match, not a whole res_dec, because every
-- script checks every kept hold.
local function res_final(raw)
  if string.byte(raw, 1) == 97 then return nil end -- 'a': active
  local f = string.match(raw, '^[^|]*|[^|]*|[^|]*|[^|]*|[^|]*|([^|]*)|')
  if not f or f == '' then return nil end
  return b36_dec(f)
end

-- res_member is the partition hold-expiry zset member of a reservation.
local function res_member(tenant, env, customer, id)
  return tenant .. '|' .. env .. '|' .. customer .. '|' .. id
end

-- json_members splits JSON object text into its members {key text, value
-- text}, both raw (values keep their exact digits, which a cjson round trip
-- would not); nil when s is not an object.
local function json_members(s)
  local out, i, n = {}, 1, #s
  local function ch() return string.sub(s, i, i) end
  local function ws() i = string.find(s, '[^ \t\r\n]', i) or (n + 1) end
  -- str_end is the index of the quote closing the string opening at j.
  local function str_end(j)
    j = j + 1
    while j <= n do
      local c = string.sub(s, j, j)
      if c == '\\' then j = j + 2 elseif c == '"' then return j else j = j + 1 end
    end
    return nil
  end
  ws()
  if ch() ~= '{' then return nil end
  i = i + 1
  ws()
  if ch() == '}' then return out end
  while true do
    ws()
    if ch() ~= '"' then return nil end
    local ke = str_end(i)
    if not ke then return nil end
    local key = string.sub(s, i, ke)
    i = ke + 1
    ws()
    if ch() ~= ':' then return nil end
    i = i + 1
    ws()
    local vs, depth = i, 0
    while i <= n do
      local c = ch()
      if c == '"' then
        local e = str_end(i)
        if not e then return nil end
        i = e + 1
      elseif c == '{' or c == '[' then
        depth = depth + 1
        i = i + 1
      elseif c == '}' or c == ']' then
        if depth == 0 then break end
        depth = depth - 1
        i = i + 1
      elseif c == ',' and depth == 0 then
        break
      else
        i = i + 1
      end
    end
    local val = string.match(string.sub(s, vs, i - 1), '^(.-)%s*$')
    if val == '' then return nil end
    out[#out + 1] = {key, val}
    if ch() == ',' then
      i = i + 1
    elseif ch() == '}' then
      return out
    else
      return nil
    end
  end
end

-- meta_merge is the stored metadata object with the keys of incoming
-- added or replaced (both JSON text, '' when empty); nil when either is
-- not a JSON object. Keys compare decoded, so differently escaped
-- spellings of one key are one key.
local function meta_merge(stored, incoming)
  if incoming == '' then return stored end
  if stored == '' then return incoming end
  local a, b = json_members(stored), json_members(incoming)
  if not a or not b then return nil end
  local pos = {}
  for i, m in ipairs(a) do pos[cjson.decode(m[1])] = i end
  for _, m in ipairs(b) do
    local k = cjson.decode(m[1])
    if pos[k] then
      a[pos[k]] = m
    else
      a[#a + 1] = m
      pos[k] = #a
    end
  end
  local parts = {}
  for i, m in ipairs(a) do parts[i] = m[1] .. ':' .. m[2] end
  return '{' .. table.concat(parts, ',') .. '}'
end

-- deep_eq compares two decoded JSON values (objects key by key).
local function deep_eq(x, y)
  if type(x) ~= type(y) then return false end
  if type(x) ~= 'table' then return x == y end
  for k, v in pairs(x) do
    if not deep_eq(v, y[k]) then return false end
  end
  for k in pairs(y) do
    if x[k] == nil then return false end
  end
  return true
end

-- meta_matches: meta holds every key of match with an equal JSON value.
local function meta_matches(meta, match)
  if type(meta) ~= 'table' then return false end
  for k, v in pairs(match) do
    if not deep_eq(meta[k], v) then return false end
  end
  return true
end

-- acct_field decodes one account hash field into a.
-- Kinds are told by byte, not by substring: every script reads every
-- field, and each new Lua string costs an allocation and an intern.
local BYTE_COLON, BYTE_B, BYTE_R, BYTE_G, BYTE_M, BYTE_N, BYTE_A = 58, 98, 114, 103, 109, 110, 97

-- ACCT_NAME sorts the account's own fields by name (a table look-up, no
-- string.byte call): 1 a number, 2 money, 3 text, 4 a layout v2 field. A
-- name it lacks has a prefix ("b:", "r:", ...) or is unknown.
local ACCT_NAME = {v = 1, ua = 1, rs = 2, le = 2, d = 2, id = 3, t = 3, e = 3, sc = 3, s = 4, o = 4, k = 4}

local function acct_field(a, f, v)
  local kind = ACCT_NAME[f]
  if kind == 1 then
    a[f] = tonumber(v)
    return
  elseif kind == 2 then
    a[f] = m_parse(v)
    if f == 'rs' then
      a.rs_stored = true
    elseif f == 'le' then
      a.le_s, a.le_k = v, a.le
    else
      a.d_stored = true
    end
    return
  elseif kind == 3 then
    a[f] = v
    return
  end
  local k1, k2 = string.byte(f, 1, 2)
  if k2 == BYTE_COLON and k1 == BYTE_B then
    local b = block_dec(string.sub(f, 3), v)
    a.blocks[#a.blocks + 1] = b
    if b.scope then a.scoped = true end
  elseif k2 == BYTE_COLON and k1 == BYTE_R then
    -- Reservations stay encoded until a script asks for one (res_get).
    a.res[string.sub(f, 3)] = v
    if string.byte(v, 1) == BYTE_A then a.active = a.active + 1 end
  elseif k2 == BYTE_COLON and k1 == BYTE_G then
    a.gauges[string.sub(f, 3)] = v
  else
    a[f] = v
  end
end

-- acct_read_all loads the account hash but its metadata fields: nil when
-- it is missing (NOSTATE). HKEYS then HMGET (in slices, under unpack's
-- limit) instead of HGETALL, so metadata is never copied into the script.
-- The slow path of acct_read: every block decoded, every hold counted.
local function acct_read_all(key)
  local names = redis.call('HKEYS', key)
  if #names == 0 then return nil end
  -- The members set later are named too (nil), so the table is made at
  -- its final size: each growth past a power of two rehashes every member.
  local a = {key = key, id = '', t = '', e = '', v = 0, rs = MONEY_ZERO, le = MONEY_ZERO, d = MONEY_ZERO,
    d_stored = nil, ua = 0, blocks = {},
    res = {}, res_dirty = {}, res_meta = {}, gauges = {}, active = 0, kept = {}, x = {}, layout = nil,
    le_s = nil, le_k = nil, v_s = nil, v_n = nil, bal = nil, pend = nil, nlive = nil, nblocks = nil,
    exp_min = nil, start_min = nil, start_max = nil, rs_stored = nil, bal_s = nil, bal_k = nil}
  local want = {}
  for _, f in ipairs(names) do
    local kind = ACCT_NAME[f]
    if kind == 4 then
      -- Layout v2 fields: rebuilt by acct_commit, never read here.
      a.layout = true
    elseif kind then
      want[#want + 1] = f
    else
      local k1, k2 = string.byte(f, 1, 2)
      if k2 ~= BYTE_COLON or (k1 ~= BYTE_M and k1 ~= BYTE_N) then want[#want + 1] = f end
    end
  end
  for first = 1, #want, 1000 do
    local last = math.min(first + 999, #want)
    local vals = redis.call('HMGET', key, unpack(want, first, last))
    for i = first, last do acct_field(a, want[i], vals[i - first + 1]) end
  end
  for id, raw in pairs(a.res) do
    local final = res_final(raw)
    if final then a.kept[#a.kept + 1] = {id, final} end
  end
  return a
end

-- live: the block has credit and has not reached expires_at (a block stops
-- counting at that very instant), as engine.MutationBlock.Live.
local function live(b, now) return m_pos(b.rem) and (b.expires == nil or b.expires > now) end

-- started: the block may be spent (stack_after blocks wait for their start).
local function started(b, now) return b.starts <= now end

-- live_count is the number of a's live blocks at now (MAX_LIVE_BLOCKS).
local function live_count(a, now)
  if a.fast then return a.nlive end
  local n = 0
  for _, b in ipairs(a.blocks) do
    if live(b, now) then n = n + 1 end
  end
  return n
end

-- block_meta is the metadata JSON text of block b, '' when it has none.
local function block_meta(key, b)
  if b.meta ~= '' then return b.meta end
  return redis.call('HGET', key, 'm:' .. b.id) or ''
end

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
      if not started(b, now) then pend = m_add(pend, b.rem) end
    end
  end
  return bal, pend, m_sub(m_sub(bal, reserved), pend)
end

-- Account layout v2 (docs/decisions.md, "Account layout v2"): three fields
-- let a money script touch only what it drains instead of decoding every
-- block and hold of the hash.
--   "s"  summary: balance|pending|live blocks|active holds|E|S|F, money and
--        counts in decimal, instants in decimal Unix ms ("" for none): the
--        figures of the live blocks at the instant u of the last write
--        (field "ua"); E the soonest expires_at of a block with credit, S
--        the soonest start after u, F the latest start at or before u. While
--        F <= now < min(E, S) no block has expired or started since, so the
--        summary is exact at now without decoding a block.
--   "o"  spend-order index: every block with credit as
--        "id,priority,expires,created,starts" (instants decimal, expires ""
--        for none), joined by " " in engine.SpendOrder order (spends_before).
--   "k"  kept finalized holds as "id,finalized" joined by " ", by
--        (finalized, id): pruning reads one field.
-- All three are a function of the hash's blocks and holds and of u (load.go
-- writes the same from Postgres, so a rebuilt hash is byte for byte the
-- live one). A hash without them (written before layout v2), or with now
-- outside [F, min(E, S)), takes the slow path: acct_read_all, expire what
-- is due, and acct_commit rewrites all three.
-- LAYOUT_MIN_ITEMS: an account of fewer blocks and active holds than this
-- (kept holds, at most MAX_KEPT_HOLDS, do not count) goes
-- without the three fields (its slow path reads a handful of fields, and
-- the index, longer than 64 bytes, would turn a compact listpack hash into
-- a hashtable: three times the memory).
local LAYOUT_MIN_ITEMS = 8
local IDX_PAT = '([^ ,]+),([^,]*),([^,]*),([^,]*),([^ ]*)'

-- idx_entry is block b's entry in the spend-order index.
local function idx_entry(b)
  local exp = ''
  if b.expires then exp = i_fmt(b.expires) end
  return b.id .. ',' .. i_fmt(b.prio) .. ',' .. exp .. ',' .. i_fmt(b.created) .. ',' .. i_fmt(b.starts)
end

-- idx_from is the start of the first entry of index idx at or after byte
-- p (entries open the string and follow each space), nil when none.
local function idx_from(idx, p)
  if p <= 1 then return 1 end
  local sp = string.find(idx, ' ', p - 1, true)
  return sp and sp + 1
end

-- idx_insert is index idx with block b's entry at its spend-order place,
-- before the first entry b spends before. The index is in spend order, so
-- that entry is found by bisecting byte positions: about log2(#idx)
-- entries parsed instead of every one before the place (a walk cost a
-- grant to a 100-block account ~120 us).
local function idx_insert(idx, b)
  local e = idx_entry(b)
  if idx == '' then return e end
  local n = #idx
  -- lo: 0 or the start of an entry b does not spend before; hi: n + 2 (the
  -- end) or the start of an entry b spends before. Each probe is an entry
  -- start strictly between them, so the range shrinks every time.
  local lo, hi = 0, n + 2
  while true do
    local s = idx_from(idx, math.max(math.floor((lo + hi) / 2), lo + 1))
    if not s or s >= hi then
      s = idx_from(idx, lo + 1)
      if not s or s >= hi then break end
    end
    local id, prio, exp, created = string.match(idx, '^([^ ,]+),([^,]*),([^,]*),([^,]*)', s)
    if spends_before(b, {id = id, prio = tonumber(prio), expires = tonumber(exp), created = tonumber(created)}) then
      hi = s
    else
      lo = s
    end
  end
  if hi > n then return idx .. ' ' .. e end
  return string.sub(idx, 1, hi - 1) .. e .. ' ' .. string.sub(idx, hi)
end

-- idx_remove is index idx without the entries of the block ids in set
-- gone (ids are 22 or 36 characters of [-0-9A-Za-z_], never a suffix of a
-- number, so "id," only ever opens an entry). Redis's Lua
-- hashes every byte of every string it makes, so each new index string
-- costs its length: the leading run of gone entries (a drain empties blocks
-- in spend order, so usually all of them) leaves in one string.sub, and
-- only the rest pay a cut each.
local function idx_remove(idx, gone)
  local pos, n = 1, #idx
  while pos <= n do
    local comma = string.find(idx, ',', pos, true)
    if not comma or not gone[string.sub(idx, pos, comma - 1)] then break end
    gone[string.sub(idx, pos, comma - 1)] = nil
    local sp = string.find(idx, ' ', comma, true)
    pos = sp and sp + 1 or n + 2
  end
  if pos > 1 then idx = string.sub(idx, pos) end
  for id in pairs(gone) do
    local s = string.find(idx, id .. ',', 1, true)
    if s then
      local sp = string.find(idx, ' ', s, true)
      if sp then
        if s == 1 then idx = string.sub(idx, sp + 1) else idx = string.sub(idx, 1, s - 1) .. string.sub(idx, sp + 1) end
      elseif s == 1 then
        idx = ''
      else
        idx = string.sub(idx, 1, s - 2)
      end
    end
  end
  return idx
end

-- idx_bounds is E, S and F (summary) of the blocks of index idx at u.
local function idx_bounds(idx, u)
  local e, s, f = nil, nil, nil
  for exp, st in string.gmatch(idx, '[^ ,]+,[^,]*,([^,]*),[^,]*,([^ ]*)') do
    local x, y = tonumber(exp), tonumber(st)
    if x and (e == nil or x < e) then e = x end
    if y > u then
      if s == nil or y < s then s = y end
    elseif f == nil or y > f then
      f = y
    end
  end
  return e, s, f
end

-- opt_fmt is an optional instant as summary text.
local function opt_fmt(n)
  if n then return i_fmt(n) end
  return ''
end

-- kept_before orders kept holds {id, finalized}: oldest first, then id.
local function kept_before(x, y)
  if x[2] ~= y[2] then return x[2] < y[2] end
  return str_less(x[1], y[1])
end

-- acct_read loads what a money script needs of the account hash: nil when
-- it is missing (NOSTATE). On the fast path one HMGET of the account
-- fields, the summary, the kept list and extras (field names the script
-- needs, as a.x[name], nil when absent; "o", the index, only for a script
-- that drains or adds a block: a long string costs a hash of every byte)
-- and no block: a.fast, a.bal, a.pend, a.nlive, a.idx; drain then reads
-- only the blocks it takes.
-- full (or a hash the summary does not cover at now) reads every block
-- (acct_read_all).
local function acct_read(key, now, extras, full, scoped_fast)
  -- HLEN first (O(1)): a hash of fewer fields than the account fields and
  -- LAYOUT_MIN_ITEMS blocks or holds has no layout v2 fields, so it goes
  -- straight to the slow path, which is short for it.
  if not full and redis.call('HLEN', key) >= LAYOUT_MIN_ITEMS + 5 then
    -- Field "sc" counts the scoped blocks of a hash: its money scripts
    -- read every block (scope_free), so it takes the slow path; but for a
    -- script that handles it (scoped_fast: consume.lua, scope_fast) while
    -- no hold is active, when the spend order alone decides.
    local v = redis.call('HMGET', key, 'id', 'v', 'rs', 'le', 'ua', 's', 'k', 'd', 'sc', unpack(extras))
    local whole = v[2] and v[6] and v[7] and (not v[9] or scoped_fast)
    for i, name in ipairs(extras) do
      if name == 'o' and not v[9 + i] then whole = false end
    end
    if whole then
      local bal, tail, pend, nlive, nact, e, st, f =
        string.match(v[6], '^([^|]*)|(([^|]*)|([^|]*)|([^|]*)|([^|]*)|([^|]*)|([^|]*))$')
      e, st, f = tonumber(e), tonumber(st), tonumber(f)
      local u = tonumber(v[5] or '0')
      -- E past u too: a write that left due blocks (gauge expires
      -- nothing) is never trusted, even by a clock behind it.
      local fast = bal and (f == nil or f <= now) and (e == nil or (now < e and u < e)) and (st == nil or now < st)
      if v[9] and nact ~= '0' then fast, bal = false, nil end
      -- Time moved past E or S since a clean write: the refresh below
      -- reads just the blocks that expired or started.
      local refresh = not fast and bal and u <= now and (e == nil or u < e)
      if fast or refresh then
        -- Members set later are named (nil): the table is made at its
        -- final size (acct_read_all).
        local a = {fast = true, key = key, id = v[1] or '', v = tonumber(v[2]), rs = MONEY_ZERO, le = MONEY_ZERO,
          d = MONEY_ZERO, d_stored = nil,
          ua = u, blocks = {}, res = {}, res_dirty = {}, res_meta = {}, kept = {}, x = {},
          bal = m_stored(bal), pend = m_stored(pend), nlive = tonumber(nlive), active = tonumber(nact),
          exp_min = e, start_min = st, start_max = f, nblocks = nil, rs_stored = nil, le_s = nil, le_k = nil,
          s_tail = nil, idx = nil, v_s = nil, v_n = nil, bal_s = nil, bal_k = nil}
        -- The summary past the balance as read, with the values it stands
        -- for: acct_commit writes it back as is when none moved.
        a.s_tail = {tail, a.pend, a.nlive, a.active, e, st, f}
        -- A scoped hash without holds read by a scoped_fast script.
        a.sc_fast, a.sc_n = v[9] and true or nil, v[9] and tonumber(v[9]) or nil
        -- Every block of the index is live at u (E is past u).
        a.nblocks = a.nlive
        if v[3] then a.rs, a.rs_stored = m_parse(v[3]), true end
        if v[8] then a.d, a.d_stored = m_parse(v[8]), true end
        if v[4] then a.le = m_parse(v[4]) a.le_s, a.le_k = v[4], a.le end
        for id, fin in string.gmatch(v[7], '([^ ,]+),([^ ]+)') do a.kept[#a.kept + 1] = {id, tonumber(fin)} end
        for i, name in ipairs(extras) do a.x[name] = v[9 + i] or nil end
        a.idx = a.x.o
        if refresh then
          -- Blocks due at now leave the figures (expire_due zeroes them:
          -- a.due); blocks started in (u, now] leave pending. Only they
          -- are read.
          if not a.idx then a.idx = redis.call('HGET', key, 'o') or '' end
          local touched, names = {}, {}
          for id, exp, sts in string.gmatch(a.idx, '([^ ,]+),[^,]*,([^,]*),[^,]*,([^ ]*)') do
            local x, y = tonumber(exp), tonumber(sts)
            if (x and x <= now) or (y > u and y <= now) then
              touched[#touched + 1] = {id, x and x <= now, y > u}
              names[#names + 1] = 'b:' .. id
            end
          end
          a.due = {}
          if #names > 0 then
            local vals = redis.call('HMGET', key, unpack(names))
            for i, t in ipairs(touched) do
              if not vals[i] then error('the spend-order index names block ' .. t[1] .. ', which the hash lacks') end
              local b = block_dec(t[1], vals[i])
              if t[3] then a.pend = m_sub(a.pend, b.rem) end
              if t[2] then
                a.bal, a.nlive, b.gone = m_sub(a.bal, b.rem), a.nlive - 1, true
                a.due[#a.due + 1] = b
              end
            end
          end
          a.bounds_stale = true
        end
        return a
      end
    end
  end
  local a = acct_read_all(key)
  if not a then return nil end
  for _, name in ipairs(extras) do
    local k1, k2 = string.byte(name, 1, 2)
    if k2 == BYTE_COLON and k1 == BYTE_R then
      a.x[name] = a.res[string.sub(name, 3)]
    elseif k2 == BYTE_COLON and k1 == BYTE_G then
      a.x[name] = a.gauges[string.sub(name, 3)]
    elseif name ~= 'o' then -- the slow path rebuilds the index
      a.x[name] = redis.call('HGET', key, name) or nil
    end
  end
  return a
end

-- acct_bal is balances of a at now: the summary's figures (kept current by
-- acct_commit) when a has them, else summed over a.blocks; the balance and
-- the effective balance count the debt of the credit line (a.d, field "d":
-- docs/decisions.md "Credit line"), so either may be negative.
local function acct_bal(a, now)
  local bal, pend, eff
  if a.bal then
    bal, pend, eff = a.bal, a.pend, m_sub(m_sub(a.bal, a.rs), a.pend)
  else
    bal, pend, eff = balances(a.blocks, a.rs, now)
  end
  if m_pos(a.d) then return m_sub(bal, a.d), pend, m_sub(eff, a.d) end
  return bal, pend, eff
end

-- line_of is the credit line (engine.MutationContext "lim", millicredits)
-- of the customer whose context is ctx: zero when it has none.
local function line_of(ctx)
  local s = string.match(ctx or '', '"lim":(%d+)')
  return (s and m_parse(s)) or MONEY_ZERO
end

-- line_split decides a charge of cost under policy block that frees held
-- (the part of a hold it settles; zero outside a commit) for account a of
-- effective balance eff and credit line lim: nil when the effective balance
-- would end below minus the line (eff + held - cost < -lim), else what the
-- started blocks pay and what goes on the line as debt. The blocks pay all
-- they have beyond the other holds (eff + debt + held) before the line is
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

-- Credits scoped to metrics (docs/rules.md "Credits scoped to metrics",
-- docs/decisions.md): a block with a scope (b.scope, ",k1,k2,") pays only
-- for the metrics it names, one without pays for every metric. Holds stay
-- one reserved total ("rs"), so while any is active every metric m that
-- one holds for must keep E(m) >= rs, E(m) being what the started live
-- blocks that apply to m hold: then each hold can always be settled from
-- blocks that apply to it, whatever is charged in between. A charge for
-- metric M therefore takes, in spend order, only blocks that apply to M,
-- and no more than keeps that true (scope_free); a hold may take what
-- keeps it true with itself added (scope_room). A multi-metric hold
-- (metric "") is backed by unscoped blocks only. Only a hash holding a
-- scoped block (a.scoped) runs these; for any other every block applies to
-- every metric and the figures are the plain ones (line_split). Each is
-- engine.ScopeFree / engine.ScopeRoom in Go (lua TestScopeFreeAgrees).

-- scope_keys is the set of metric keys of scoped block b, parsed once per
-- script (kept on b): a charge asks each block about every hold metric.
local function scope_keys(b)
  local set = b.keyset
  if not set then
    set = {}
    for k in string.gmatch(b.scope, '[^,]+') do set[k] = true end
    b.keyset = set
  end
  return set
end

-- applies: block b pays for metric (never for "", a multi-metric hold).
local function applies(b, metric)
  return b.scope == nil or scope_keys(b)[metric] == true
end

local RES_METRIC_PAT = '^[^|]*|[^|]*|[^|]*|[^|]*|[^|]*|[^|]*|[^|]*|[^|]*|[^|]*|([^|]*)|'

-- scope_holds is the distinct metrics of a's active holds but hold skip,
-- and each one's index in that list.
local function scope_holds(a, skip)
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
-- against as many hold metrics stay a few thousand look-ups).
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
  -- "" (a multi-metric hold) has the unscoped credit only, like any metric.
  for i = 1, #ms do e[i] = m_add(e[i], all) end
  return e
end

-- scope_free is the most a charge for metric may take from the blocks, up
-- to need (the charge; nil: no bound): the started live blocks that apply
-- to it, walked in spend order as drain takes them, up to where one more
-- unit would leave some hold metric's E below the reserved total less
-- freed (what the charge settles of its own hold; skip: that hold's id when
-- it ends). Never negative.
local function scope_free(a, now, metric, freed, skip, need)
  local hm, at = scope_holds(a, skip)
  local slack = scope_elig(a, now, hm, at)
  local owed = m_sub(a.rs, freed)
  local elig, taken = {}, {}
  for i = 1, #hm do slack[i], taken[i] = m_sub(slack[i], owed), MONEY_ZERO end
  for _, b in ipairs(a.blocks) do
    if live(b, now) and started(b, now) and applies(b, metric) then elig[#elig + 1] = b end
  end
  table.sort(elig, spends_before)
  local cum, cap = MONEY_ZERO, nil
  -- take: block b's whole remainder counted against hold metric i.
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

-- scope_room is what a new hold for metric (or a hold for it growing) may
-- take: min over metric and the metrics of the active holds of E(m) less
-- the reserved total. May be negative (holds leaning on the credit line).
local function scope_room(a, now, metric)
  local hm, at = scope_holds(a, nil)
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

-- scope_reserve_ok: a hold for metric may grow by cost with line (what the
-- line lends under block) on top of the effective balance eff.
local function scope_reserve_ok(a, now, metric, eff, cost, line)
  if m_cmp(m_add(eff, line), cost) < 0 then return false end
  if not a.scoped then return true end
  return m_cmp(m_add(m_sub(scope_room(a, now, metric), a.d), line), cost) >= 0
end

-- expire_due zeroes every block with credit whose expires_at is at or before
-- now, appending its expiry entry and the block to entries and changed.
local function expire_due(a, now, entries, changed)
  -- On the fast path only the blocks a refresh found due (acct_read).
  if a.fast then
    if a.due and #a.due > 0 then
      table.sort(a.due, spends_before)
      for _, b in ipairs(a.due) do
        entries[#entries + 1] = entry_json('expiry', m_neg(b.rem), 'expiry', b.src, b.id, '', '')
        b.rem = MONEY_ZERO
        changed[#changed + 1] = b
      end
    end
    a.due = nil
    return
  end
  local due = {}
  for _, b in ipairs(a.blocks) do
    if b.expires and b.expires <= now and m_pos(b.rem) then due[#due + 1] = b end
  end
  table.sort(due, spends_before)
  for _, b in ipairs(due) do
    entries[#entries + 1] = entry_json('expiry', m_neg(b.rem), 'expiry', b.src, b.id, '', '')
    b.rem = MONEY_ZERO
    changed[#changed + 1] = b
  end
end

-- draw takes what it can of left from block b, records the draw and the
-- changed block, and returns what is left: both of drain's walks draw
-- through it, so they cannot differ in how a block is charged.
local function draw(b, left, draws, changed)
  local take = m_min(b.rem, left)
  b.rem = m_sub(b.rem, take)
  draws[#draws + 1] = {b = b, take = take}
  changed[#changed + 1] = b
  return m_sub(left, take)
end

-- drain takes amount from a's started live blocks in spend order
-- (engine.SpendOrder), appending each block touched to changed; it returns
-- the draws {b = block, take = money}. The caller has checked that the
-- blocks hold amount (with metric: the blocks that apply to it, scope_free).
local function drain(a, now, amount, changed, metric)
  if a.fast then
    -- Walk the spend-order index, reading only the blocks taken from (in
    -- HMGETs of 1, 4, 16 ... entries: one block pays most charges, and
    -- each entry parsed costs about as much as an HMGET), skipping those
    -- not started yet.
    if not a.idx then a.idx = redis.call('HGET', a.key, 'o') or '' end
    local draws, left, pos, want = {}, amount, 1, 1
    while m_pos(left) do
      local ids, names, texts = {}, {}, {}
      while #ids < want do
        local s, fin, id, _, exp, _, st = string.find(a.idx, IDX_PAT, pos)
        if not s then break end
        pos = fin + 2
        local x, y = tonumber(exp), tonumber(st)
        -- Not started, or due (a refresh's expire_due zeroed it already).
        if y <= now and (x == nil or x > now) then
          ids[#ids + 1] = id
          names[#names + 1] = 'b:' .. id
          texts[#ids] = {exp, x, st, y}
        end
      end
      if #ids == 0 then break end
      local vals = redis.call('HMGET', a.key, unpack(names))
      for i, id in ipairs(ids) do
        if not m_pos(left) then break end
        if not vals[i] then error('the spend-order index names block ' .. id .. ', which the hash lacks') end
        -- A scoped hash's fast path (scope_fast): only blocks that apply,
        -- told from the value's scope field before decoding it.
        local raw, ok = vals[i], true
        if metric and a.sc_fast then
          local at = string.find(raw, '|@', 1, true)
          ok = not at or string.find(',' .. string.sub(raw, at + 2) .. ',', ',' .. metric .. ',', 1, true) ~= nil
        end
        if ok then
          local b = block_dec(id, raw)
          b.rem0 = b.rem
          -- The index's decimal instants, for block_json (no sprintf).
          b.ix = texts[i]
          left = draw(b, left, draws, changed)
        end
      end
      want = want * 4
    end
    return draws
  end
  local spendable = {}
  for _, b in ipairs(a.blocks) do
    -- With metric, only the blocks that apply to it (the fast path above
    -- tells them by their value on a scoped hash, a.sc_fast).
    if live(b, now) and started(b, now) and (not metric or applies(b, metric)) then spendable[#spendable + 1] = b end
  end
  -- The next block in spend order, picked by a scan rather than a sort of
  -- them all: a charge usually draws from one or two blocks, so this costs
  -- one pass per block drawn instead of n log n comparisons (invariant 13).
  -- After four picks the rest is sorted once (a drain of many blocks).
  local draws, left, sorted, at = {}, amount, false, 0
  while m_pos(left) do
    local b
    if sorted then
      at = at + 1
      b = spendable[at]
    elseif #draws == 4 then
      table.sort(spendable, spends_before)
      sorted, at = true, 1
      b = spendable[1]
    elseif #spendable > 0 then
      local i0 = 1
      for i = 2, #spendable do
        if spends_before(spendable[i], spendable[i0]) then i0 = i end
      end
      b = table.remove(spendable, i0)
    end
    if not b then break end
    left = draw(b, left, draws, changed)
  end
  return draws
end

-- scope_fast decides and drains a charge of cost for metric on a scoped
-- hash without active holds read on the fast path (a.sc_fast): with no
-- hold to keep backed, what the blocks may pay is what applies to the
-- metric (scope_free with no hold metric), which the drain finds walking
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

-- scope_items charges the items {metric, cost} of a multi-metric call on
-- an account holding scoped blocks one after another, each from the
-- blocks that apply to its metric (scope_split under block, refusing;
-- else scope_avail, avail being what the account has), the figures moving
-- as each drains; base is the effective balance plus what the call
-- settles of its hold. It returns what the blocks paid, what goes on the
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
  return paid, debt, draws
end

-- OP_RECORD_CONSUME ('c') opens the compact op record of a consume; a
-- stored Mutation JSON (other scripts, and every op key a rebuild writes)
-- opens with '{'. OP_RH_LEN is how much of the request hash it keeps: 128
-- bits tell a retry from another request as well as the whole hash.
local OP_RECORD_CONSUME = 99
local OP_RH_LEN = 32

-- op_record_consume is what a consume's op key remembers (lua/oprecord.go
-- decodes it): "c" request hash prefix "\n" then, joined by "|", op id, at
-- (ms), index of the consumption entry, units, cost, charged, overage,
-- balance, reserved, pending and the metric (never holds "|"). That is every
-- number the consume answer is built from, in about a fifth of the bytes
-- of the Mutation JSON.
-- Its arguments come formatted (mutation_json left the account figures in
-- m), so nothing is formatted twice.
local function op_record_consume(m, idx, metric, units, cost, charged, overage)
  return 'c' .. string.sub(m.rh, 1, OP_RH_LEN) .. '\n' .. m.op .. '|' .. m.at_s .. '|' .. idx .. '|' ..
    units .. '|' .. cost .. '|' .. charged .. '|' .. overage .. '|' .. m.bal_s .. '|' .. m.rs_s .. '|' ..
    m.pend_s .. '|' .. metric
end

-- The seen filter (issue 26: no Postgres before a money call). An op key
-- lives until the persister has committed its operation, then a minute
-- more (engine.OpKeyGrace); before shortening it the persister adds it to
-- the filter of its partition for the current week (seen_add.lua), in the
-- same script. A week's filter is a hash {prefix:pNN}:seen:<week> of
-- buckets whose values are 4-byte fingerprints of the keys in them,
-- concatenated. A money call whose op key is absent consults the last
-- SEEN_WEEKS weeks: a fingerprint found means "maybe applied" (MAYBESEEN:
-- the caller asks Postgres, lua/applied.go), none means "certainly new"
-- once the partition's filter is seeded ({prefix:pNN}:seen exists:
-- lua/seen.go seeds it from Postgres). A false "maybe" costs one Postgres
-- look-up; a false "new" cannot happen within the horizon
-- (engine.SeenHorizon).
--
-- The buckets come in five tiers, so that a partition pays for the buckets
-- its volume fills: a field costs Redis ~50 B besides its value, so in
-- 4,096 buckets a few hundred keys a week cost ~30 B each (the 24 h
-- window's whole budget per key is 100 B), while one bucket for a busy
-- partition would make every look-up read megabytes. Tier t has 2^b
-- buckets (b = 4, 6, 8, 10, 12 bits of sha1(op key name)) and takes
-- SEEN_TIER_CAP keys (64 per bucket) before the next takes over; the last
-- tier has no cap. Its fields are a tier letter and the bucket number; the
-- last tier's are the first 3 hex digits, as the single-tier filter before
-- it wrote them (its hashes read as that tier: nothing to migrate). A
-- key's fingerprint is the same 32 bits in every tier, the 8 hex digits
-- after the first 3, so disjoint from every tier's bucket bits. The tier
-- counts are the fields #1 to #4. A look-up reads a key's five buckets and
-- the counts with one HMGET per week.
local SEEN_TIERS = {
  {field = 'w', shift = 256}, -- 16 buckets: the top 4 of the first 12 bits
  {field = 'x', shift = 64},  -- 64
  {field = 'y', shift = 16},  -- 256
  {field = 'z', shift = 4},   -- 1,024
}
local SEEN_TIER_CAP = {1024, 4096, 16384, 65536}

-- seen_fp is the fingerprint of the key whose sha1 hex digest is h: the 4
-- bytes after its first 3 digits.
local function seen_fp(h)
  return string.char(tonumber(string.sub(h, 4, 5), 16), tonumber(string.sub(h, 6, 7), 16),
    tonumber(string.sub(h, 8, 9), 16), tonumber(string.sub(h, 10, 11), 16))
end

-- seen_in reports whether bucket value v holds fingerprint fp at a
-- 4-byte boundary.
local function seen_in(v, fp)
  if not v then return false end
  local i = 1
  while true do
    local at = string.find(v, fp, i, true)
    if not at then return false end
    if at % 4 == 1 then return true end
    i = at + 1
  end
end

-- seen_fields is the field of the key of digest h in each tier, the last
-- tier's at index 5.
local function seen_fields(h)
  local top = tonumber(string.sub(h, 1, 3), 16)
  local f = {}
  for t = 1, 4 do
    local tier = SEEN_TIERS[t]
    f[t] = tier.field .. math.floor(top / tier.shift)
  end
  f[5] = string.sub(h, 1, 3)
  return f
end

-- seen_read reads op key k's buckets in week hash wk: the digest, the
-- fields, and HMGET's answer (the five buckets, then the counts #1-#4).
local function seen_read(wk, k)
  local h = redis.sha1hex(k)
  local f = seen_fields(h)
  return h, f, redis.call('HMGET', wk, f[1], f[2], f[3], f[4], f[5], '#1', '#2', '#3', '#4')
end

-- seen_has reports whether the buckets v (seen_read) hold fingerprint fp.
local function seen_has(fp, v)
  for t = 1, 5 do
    if seen_in(v[t], fp) then return true end
  end
  return false
end

-- seen_keys is the filter keys a money script was given from KEYS[from]
-- on (the seeded mark, then the week hashes), nil when none.
local function seen_keys(keys, from)
  if not keys[from] then return nil end
  local t = {}
  for i = from, #keys do t[#t + 1] = keys[i] end
  return t
end

-- seen_maybe reports whether op key k may name an operation applied
-- before (see above): always when the partition is not seeded.
local function seen_maybe(seen, k)
  if redis.call('EXISTS', seen[1]) == 0 then return true end
  for i = 2, #seen do
    local h, _, v = seen_read(seen[i], k)
    if seen_has(seen_fp(h), v) then return true end
  end
  return false
end

-- seen_put adds op key k to week hash wk unless it is there already, in
-- the first tier not full.
local function seen_put(wk, k)
  local h, f, v = seen_read(wk, k)
  local fp = seen_fp(h)
  if seen_has(fp, v) then return end
  local t = 5
  for i = 1, 4 do
    if (tonumber(v[5 + i]) or 0) < SEEN_TIER_CAP[i] then
      t = i
      break
    end
  end
  redis.call('HSET', wk, f[t], (v[t] or '') .. fp)
  if t < 5 then redis.call('HINCRBY', wk, '#' .. t, 1) end
end

-- replay answers a retried idempotency key: nil when op_key is absent or
-- unused, else the reply to return (the stored Mutation, or MISMATCH when it
-- was produced by another request). With seen (seen_keys), an absent op key
-- that the seen filter may know answers MAYBESEEN.
local function replay(op_key, rh, seen)
  if not op_key then return nil end
  local prev = redis.call('GET', op_key)
  if not prev then
    if seen and seen_maybe(seen, op_key) then
      return redis.error_reply('MAYBESEEN the idempotency key may have been applied before')
    end
    return nil
  end
  if string.byte(prev, 1) == OP_RECORD_CONSUME then
    -- A compact consume record (op_record_consume): the request hash
    -- prefix runs up to the first newline.
    local nl = string.find(prev, '\n', 1, true)
    if not nl or string.sub(prev, 2, nl - 1) ~= string.sub(rh, 1, OP_RH_LEN) then
      return redis.error_reply('MISMATCH idempotency key used with another request')
    end
    return {'replay', prev}
  end
  local ok, m = pcall(cjson.decode, prev)
  if ok and type(m) == 'table' and m.rh ~= rh then
    return redis.error_reply('MISMATCH idempotency key used with another request')
  end
  return {'replay', prev}
end

-- commit_open reads what a commit of hold res_id needs: the account (and
-- the spend-order index when the commit drains) and the hold, active and
-- not past expires_at (the hold ends at that instant exactly, when the
-- sweep may take it). Instead of them it returns (third value) the reply:
-- a replay of op_key, or NOSTATE, NOTFOUND, NOTACTIVE or EXPIRED.
local function commit_open(key, now, res_id, drains, op_key, rh, seen)
  -- The hold's metadata field with the account: on the summary's path it
  -- rides in the same HMGET (one redis.call less than an HGET after).
  local wants = {'r:' .. res_id, 'n:' .. res_id}
  if drains then wants[3] = 'o' end
  local a = acct_read(key, now, wants)
  if not a then return nil, nil, redis.error_reply('NOSTATE no credit state for the customer') end
  local rp = replay(op_key, rh, seen)
  if rp then return nil, nil, rp end
  local raw = a.x['r:' .. res_id]
  if not raw then return nil, nil, redis.error_reply('NOTFOUND no such reservation') end
  local r = res_get(a, res_id, raw)
  if r.status ~= 'active' then return nil, nil, redis.error_reply('NOTACTIVE the reservation is ' .. r.status) end
  if now >= r.expires then return nil, nil, redis.error_reply('EXPIRED the reservation expired') end
  return a, r
end

-- reserve_open reads what a reserve of hold res_id needs: the account,
-- with the id not taken and room for one more active hold. Instead of it
-- it returns (second value) the reply: a replay of op_key, or NOSTATE,
-- BADARG (the id is taken) or TOOMANYHOLDS.
local function reserve_open(key, now, res_id, op_key, rh, seen)
  local a = acct_read(key, now, {'r:' .. res_id})
  if not a then return nil, redis.error_reply('NOSTATE no credit state for the customer') end
  local rp = replay(op_key, rh, seen)
  if rp then return nil, rp end
  if a.x['r:' .. res_id] then return nil, redis.error_reply('BADARG the reservation id is taken') end
  if a.active >= MAX_ACTIVE_HOLDS then
    return nil, redis.error_reply('TOOMANYHOLDS the customer has the most active reservations it may hold')
  end
  return a
end

-- commit_meta is the metadata a commit leaves on hold r: merged_meta when
-- Go merged (lua/bounded.go; it only checks that Go merged into r's
-- metadata, stored_meta), else meta merged here. Instead of it it returns
-- (second value) the reply: STALE, or BADARG for metadata not an object.
local function commit_meta(r, meta, stored_meta, merged_meta)
  if merged_meta then
    if r.meta ~= stored_meta then return nil, redis.error_reply('STALE the hold changed since it was read') end
    return merged_meta
  end
  local merged = meta_merge(r.meta, meta)
  if not merged then return nil, redis.error_reply('BADARG metadata is not a JSON object') end
  return merged
end

-- le_fmt is a's lifetime earned as text: as read while unchanged (no
-- script but a grant moves it).
local function le_fmt(a)
  if a.le_k == a.le and a.le_s then return a.le_s end
  return m_fmt(a.le)
end

-- acct_commit writes the account fields, the changed blocks (emptied ones
-- are deleted with their metadata: Postgres keeps their history) and the
-- changed reservations with their metadata, drops reservations finalized
-- more than RES_KEEP_MS ago (and the oldest past MAX_KEPT_HOLDS) and keeps
-- the summary, index and kept list (layout v2 above) exact at now. Each
-- redis.call costs ~15,000 instructions, so the writes go as one HSET and
-- at most one HDEL. No expiry index is kept in Redis: the sweep asks
-- Postgres (engine.ExpiryIndex).
local function acct_commit(akey, a, changed, now)
  -- The version's text is kept for mutation_json (a.v_s while a.v_n is a.v).
  a.v_s, a.v_n = i_fmt(a.v), a.v
  local set = {'id', a.id, 'v', a.v_s, 'le', le_fmt(a), 'ua', now_fmt(now)}
  local del = {}
  -- The reserved total is kept only while it is not zero (a missing "rs"
  -- reads as zero): most accounts hold no reservation (issue 10).
  if m_cmp(a.rs, MONEY_ZERO) ~= 0 then
    set[#set + 1], set[#set + 2] = 'rs', m_fmt(a.rs)
  elseif a.rs_stored then
    del[#del + 1] = 'rs'
  end
  -- The debt of the credit line, likewise only while there is one.
  if m_pos(a.d) then
    set[#set + 1], set[#set + 2] = 'd', m_fmt(a.d)
  elseif a.d_stored then
    del[#del + 1] = 'd'
  end
  -- bounds_moved: E, S or F must be recomputed from the index (on the fast
  -- path at now they are the summary's: F <= now < min(E, S)).
  local idx_moved, bounds_moved = false, false
  -- nsc: how many blocks with credit have a scope (field "sc", absent for
  -- none): counted on the slow path, moved by each change on the fast one
  -- (a.sc_n as read); sc_moved: it changed.
  local nsc, sc_moved = a.sc_n or 0, false
  -- Ids of blocks leaving the index, cut out together after the loop.
  local gone = {}
  for _, b in ipairs(changed) do
    if m_pos(b.rem) then
      set[#set + 1], set[#set + 2] = 'b:' .. b.id, block_enc(b)
      -- A new block's metadata, or an older hash's inline metadata moving
      -- to its own field.
      if b.meta ~= '' then set[#set + 1], set[#set + 2] = 'm:' .. b.id, b.meta end
    else
      del[#del + 1], del[#del + 2] = 'b:' .. b.id, 'm:' .. b.id
    end
    if a.fast and not a.idx then a.idx = redis.call('HGET', akey, 'o') or '' end
    if a.fast then
      -- Every block of the index is live and started or pending as the
      -- summary says (now is before E and S): only the change moves it.
      if b.fresh and not m_pos(b.rem) then
        -- A grant that went whole to the debt of the credit line: a block
        -- Postgres keeps, never in the hash.
      elseif b.fresh then
        if b.scope then nsc, sc_moved = nsc + 1, true end
        a.idx, idx_moved, a.nblocks = idx_insert(a.idx, b), true, a.nblocks + 1
        if live(b, now) then
          a.nlive, a.bal = a.nlive + 1, m_add(a.bal, b.rem)
          if not started(b, now) then a.pend = m_add(a.pend, b.rem) end
        end
        -- E, S and F with one more block: no index scan.
        if b.expires and (a.exp_min == nil or b.expires < a.exp_min) then a.exp_min = b.expires end
        if b.starts > now then
          if a.start_min == nil or b.starts < a.start_min then a.start_min = b.starts end
        elseif a.start_max == nil or b.starts > a.start_max then
          a.start_max = b.starts
        end
      elseif b.gone then
        -- Due: already out of the figures (acct_read's refresh).
        gone[b.id], a.nblocks, idx_moved = true, a.nblocks - 1, true
        bounds_moved = true
        if b.scope then nsc, sc_moved = nsc - 1, true end
      else
        a.bal = m_add(a.bal, m_sub(b.rem, b.rem0))
        if not m_pos(b.rem) then
          gone[b.id], a.nlive, a.nblocks, idx_moved = true, a.nlive - 1, a.nblocks - 1, true
          if b.scope then nsc, sc_moved = nsc - 1, true end
          -- E, S and F move only when the emptied block held one of them.
          if b.expires == a.exp_min or b.starts == a.start_min or b.starts == a.start_max then bounds_moved = true end
        end
      end
    end
  end
  if next(gone) then a.idx = idx_remove(a.idx, gone) end
  local keep = nil
  if not a.fast then
    -- Slow path: the summary from every block.
    local bal, pend, n, e, st, f = MONEY_ZERO, MONEY_ZERO, 0, nil, nil, nil
    keep = {}
    nsc, sc_moved = 0, true
    for _, b in ipairs(a.blocks) do
      if m_pos(b.rem) then
        keep[#keep + 1] = b
        if b.scope then nsc = nsc + 1 end
        if live(b, now) then
          n, bal = n + 1, m_add(bal, b.rem)
          if not started(b, now) then pend = m_add(pend, b.rem) end
        end
        if b.expires and (e == nil or b.expires < e) then e = b.expires end
        if b.starts > now then
          if st == nil or b.starts < st then st = b.starts end
        elseif f == nil or b.starts > f then
          f = b.starts
        end
      end
    end
    a.bal, a.pend, a.nlive, a.nblocks, a.exp_min, a.start_min, a.start_max = bal, pend, n, #keep, e, st, f
  elseif bounds_moved or a.bounds_stale then
    a.exp_min, a.start_min, a.start_max = idx_bounds(a.idx, now)
  end
  for id in pairs(a.res_dirty) do
    set[#set + 1], set[#set + 2] = 'r:' .. id, a.res[id]
    if a.res_meta[id] and a.res_meta[id] ~= '' then set[#set + 1], set[#set + 2] = 'n:' .. id, a.res_meta[id] end
  end
  local kept, kept_moved = {}, a.kept_moved or not a.fast
  for _, k in ipairs(a.kept) do
    if k[2] + RES_KEEP_MS <= now then
      del[#del + 1], del[#del + 2] = 'r:' .. k[1], 'n:' .. k[1]
      kept_moved = true
    else
      kept[#kept + 1] = k
    end
  end
  local big = a.nblocks + a.active >= LAYOUT_MIN_ITEMS
  -- Sorted for field "k", or to prune; a small account's kept holds need
  -- no order (kept_before ties cost a byte loop).
  if (kept_moved and big) or #kept > MAX_KEPT_HOLDS then
    table.sort(kept, kept_before)
    if #kept > MAX_KEPT_HOLDS then
      kept_moved = true
      -- The oldest finalized holds leave early, down to half the cap, so
      -- this runs once per MAX_KEPT_HOLDS / 2 finalizations at most.
      local drop = #kept - MAX_KEPT_HOLDS / 2
      for i = 1, drop do del[#del + 1], del[#del + 2] = 'r:' .. kept[i][1], 'n:' .. kept[i][1] end
      kept = {unpack(kept, drop + 1)}
    end
  end
  a.kept = kept
  if big then
    if keep then
      table.sort(keep, spends_before)
      local ents = {}
      for i, b in ipairs(keep) do ents[i] = idx_entry(b) end
      a.idx, idx_moved = table.concat(ents, ' '), true
    end
    if idx_moved then set[#set + 1], set[#set + 2] = 'o', a.idx end
    if kept_moved then
      local ks = {}
      for i, k in ipairs(kept) do ks[i] = k[1] .. ',' .. i_fmt(k[2]) end
      set[#set + 1], set[#set + 2] = 'k', table.concat(ks, ' ')
    end
    -- The balance's text is kept for mutation_json (a.bal_s while a.bal_k
    -- is a.bal).
    a.bal_s, a.bal_k = m_fmt(a.bal), a.bal
    local t, tail = a.s_tail, nil
    if t and t[2] == a.pend and t[3] == a.nlive and t[4] == a.active and t[5] == a.exp_min and
        t[6] == a.start_min and t[7] == a.start_max then
      tail = t[1]
    else
      tail = m_fmt(a.pend) .. '|' .. i_fmt(a.nlive) .. '|' .. i_fmt(a.active) .. '|' .. opt_fmt(a.exp_min) .. '|' ..
        opt_fmt(a.start_min) .. '|' .. opt_fmt(a.start_max)
    end
    set[#set + 1], set[#set + 2] = 's', a.bal_s .. '|' .. tail
  elseif a.fast or a.layout then
    -- A small account goes without them (a listpack hash stays one).
    del[#del + 1], del[#del + 2], del[#del + 3] = 's', 'o', 'k'
  end
  if sc_moved and nsc > 0 then
    set[#set + 1], set[#set + 2] = 'sc', i_fmt(nsc)
  elseif sc_moved and (a.sc or a.sc_n) then
    del[#del + 1] = 'sc'
  end
  redis.call('HSET', akey, unpack(set))
  if #del > 0 then redis.call('HDEL', akey, unpack(del)) end
end

-- mutation_json builds the engine.Mutation of a change (account figures at
-- now, after it); m holds op, kind, tenant, customer, env, idem (JSON text),
-- rh, now and optionally ctx (engine.MutationContext JSON text from Go,
-- spliced as is), eb (effective balance before the change, money),
-- open_meta (the metadata of the last entry, which entry_obj left open),
-- extra (more members: ',"usage":{...}') and res (a reservation, written
-- as member "res" with its metadata, in the same concatenation: a long
-- string is copied once); then the account a, entries and changed blocks.
local function mutation_json(m, a, entries, changed)
  -- acct_bal's figures without the effective balance it would also compute.
  local bal, pend = a.bal, a.pend
  if not bal then bal, pend = balances(a.blocks, a.rs, m.now) end
  local r = m.res
  -- Kept formatted for an op record (op_record_consume).
  local rs = a.rs
  m.bal_s, m.pend_s, m.at_s = (bal == a.bal_k and a.bal_s) or m_fmt(bal), m_fmt(pend), now_fmt(m.now)
  -- The balance counts the debt of the credit line (acct_bal), which the
  -- account section also names while there is one.
  local debt_s = ''
  if m_pos(a.d) then
    m.bal_s, debt_s = m_fmt(m_sub(bal, a.d)), ',"debt":' .. m_fmt(a.d)
  end
  m.rs_s = (rs[1] == 0 and rs[2] == 0) and '0' or m_fmt(rs)
  local bj = {}
  for i, b in ipairs(changed) do bj[i] = block_json(b) end
  -- Quotes are written inline (q would make a string per member).
  return '{"op":"' .. m.op .. '","kind":"' .. m.kind .. '","tenant":"' .. m.tenant ..
    '","customer":"' .. m.customer .. '","env":"' .. m.env .. '","idem":' .. m.idem ..
    ',"rh":"' .. m.rh .. '","at":' .. m.at_s ..
    ',"account":{"id":"' .. a.id .. '","version":' .. ((a.v_n == a.v and a.v_s) or i_fmt(a.v)) ..
    ',"balance":' .. m.bal_s ..
    ',"reserved":' .. m.rs_s .. ',"pending":' .. m.pend_s .. ',"lifetime_earned":' .. le_fmt(a) .. debt_s ..
    '},"entries":[' .. table.concat(entries, ',') .. ((m.open_meta and m.open_meta ~= '') and ',"meta":' or '') ..
    (m.open_meta or '') .. (m.open_meta and '}' or '') .. '],"blocks":[' .. table.concat(bj, ',') .. ']' ..
    ((m.ctx and m.ctx ~= '') and (',"ctx":' .. m.ctx) or '') ..
    (m.eb and (',"eb":' .. m_fmt(m.eb)) or '') .. (m.extra or '') ..
    (r and (',"res":' .. res_json_head(r)) or '') .. ((r and r.meta ~= '') and ',"meta":' or '') ..
    (r and r.meta or '') .. (r and '}' or '') .. '}'
end

-- refuses reports whether a customer whose MutationContext is ctx is
-- refused for credit (policy block, the default) rather than charged into
-- overage (allow, notify).
local function refuses(ctx)
  local policy = string.match(ctx or '', '"policy":"(%a+)"') or 'block'
  return policy ~= 'allow' and policy ~= 'notify'
end

-- block_line is the credit line a hold may lean on: the customer's line
-- (line_of) under policy block, none under allow and notify (they never go
-- below zero: docs/rules.md "Credit line").
local function block_line(ctx)
  if refuses(ctx) then return line_of(ctx) end
  return MONEY_ZERO
end

-- refuse appends the refusal record of a customer refused for credit, for
-- credit.exhausted (docs/spec/addendum.md §8): m without an idempotency key (so Postgres
-- never takes it for an applied operation), with no entries, and with
-- usage, its usage section marked refused. The account is left untouched.
local function refuse(outbox, m, a, usage)
  m.idem, m.rh, m.extra = '""', '', ',"usage":' .. usage
  redis.call('XADD', outbox, '*', 'm', mutation_json(m, a, {}, {}))
end

-- publish appends the Mutation to the partition outbox and, under an
-- idempotency key, remembers record (the Mutation itself when nil) for
-- ttl_ms so a retry replays it.
local function publish(outbox, op_key, ttl_ms, json, record)
  redis.call('XADD', outbox, '*', 'm', json)
  if op_key then redis.call('SET', op_key, record or json, 'PX', ttl_ms) end
end


-- Gauge leases (gauge.lua, lease.lua): the active leases of gauge <metric>
-- live in field "L:<metric>" of the account hash, entries joined by " ",
-- each "id,amount,expires,created,seconds": the slots it holds, its
-- instants in Unix ms and the length it was last taken or renewed for.
-- A lease whose expires is at or before now holds nothing any more
-- (leases_split): every script that reads the field lapses it, so expiry
-- is exact at read time; the lease sweep only writes the lapse down.
-- Field "g:<metric>" counts the leased slots too. At most
-- MAX_GAUGE_LEASES leases per gauge (TOOMANYLEASES): engine.MaxGaugeLeases.
local MAX_GAUGE_LEASES = 200

-- leases_dec decodes field "L:<metric>" (nil or "" for none).
local function leases_dec(raw)
  local out = {}
  if not raw or raw == '' then return out end
  for id, amt, exp, cr, sec in string.gmatch(raw, '([^, ]+),(%d+),(%d+),(%d+),(%d+)') do
    out[#out + 1] = {id = id, amount = m_stored(amt), expires = tonumber(exp), created = tonumber(cr),
      seconds = tonumber(sec)}
  end
  return out
end

-- leases_enc is the field value of leases ls ("" for none).
local function leases_enc(ls)
  local parts = {}
  for i, l in ipairs(ls) do
    parts[i] = l.id .. ',' .. m_fmt(l.amount) .. ',' .. i_fmt(l.expires) .. ',' .. i_fmt(l.created) .. ',' ..
      i_fmt(l.seconds)
  end
  return table.concat(parts, ' ')
end

-- leases_split parts ls into the leases still active at now and those due
-- (expires at or before now), and sums the slots the active ones hold.
local function leases_split(ls, now)
  local active, due, held = {}, {}, MONEY_ZERO
  for _, l in ipairs(ls) do
    if l.expires <= now then
      due[#due + 1] = l
    else
      active[#active + 1] = l
      held = m_add(held, l.amount)
    end
  end
  return active, due, held
end

-- lease_json is lease l as an engine.MutationLease with status (active,
-- released or expired) and, once it ended, the instant it did.
local function lease_json(l, status, ended)
  local s = '{"id":' .. q(l.id) .. ',"amount":' .. m_fmt(l.amount) .. ',"status":"' .. status ..
    '","expires":' .. i_fmt(l.expires) .. ',"created":' .. i_fmt(l.created) .. ',"seconds":' .. i_fmt(l.seconds)
  if ended then s = s .. ',"ended":' .. i_fmt(ended) end
  return s .. '}'
end

-- gauge_json is the Mutation's gauge section: the count after the change
-- and the leases it opened, renewed or ended (JSON texts).
local function gauge_json(metric, cur, lease_parts)
  local s = ',"gauge":{"metric":' .. j_str(metric) .. ',"current":' .. m_fmt(cur)
  if #lease_parts > 0 then s = s .. ',"leases":[' .. table.concat(lease_parts, ',') .. ']' end
  return s .. '}'
end

-- gauge_write stores gauge metric's count and its active leases (the
-- field leaves the hash with the last one, so an idle gauge costs none);
-- had says whether the hash holds the field now.
local function gauge_write(key, metric, cur, active, had)
  if #active > 0 then
    redis.call('HSET', key, 'g:' .. metric, m_fmt(cur), 'L:' .. metric, leases_enc(active))
  else
    redis.call('HSET', key, 'g:' .. metric, m_fmt(cur))
    if had then redis.call('HDEL', key, 'L:' .. metric) end
  end
end


-- Budgets (engine/budgets.go, docs/rules.md "Budgets"): ctx member "bud"
-- (engine.BudgetArg) lists the customer's budgets, each
-- "field|from|end|limit": the counter's hash field "u:<period letter>:
-- <metric key>" (no metric key: every metric), the counting window that
-- holds now in Unix ms (Go computes it, time zones and DST included) and
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

-- budget_take reads the counters of budgets buds (budgets_of) of account
-- key akey that a charge of cost touches: a budget of every metric (metric
-- key "") counts all of it, one of a metric the cost when the charge is of
-- that metric, or, for a charge of items (each with metric and cost), the
-- items of that metric. Returns
-- the touched counters with their spend after the charge, and the first
-- budget the charge would take past its limit (nil when none), so a
-- caller may refuse before anything is written.
local function budget_take(akey, buds, metric, cost, items)
  if not buds then return nil, nil end
  local names = {}
  for i, b in ipairs(buds) do names[i] = b.f end
  local vals = redis.call('HMGET', akey, unpack(names))
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
local function budget_count(akey, hits)
  if not hits or #hits == 0 then return '' end
  local set, reached = {}, {}
  for _, h in ipairs(hits) do
    local at = m_cmp(h.after, h.b.lim) >= 0
    if at and not h.flag then reached[#reached + 1] = budget_reach_json(h, h.after) end
    set[#set + 1], set[#set + 2] = h.b.f, budget_counter_enc(h.from, h.after, at or h.flag)
  end
  redis.call('HSET', akey, unpack(set))
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

-- Shared pools (docs/rules.md "Shared pools"): a child customer spends its
-- own blocks, then its parent's (one level), up to an optional draw limit
-- per period counted in the child's hash like a budget (field "p:d" or
-- "p:m", "<from> <drawn>"). The parent's hash shares the child's slot (the
-- child's id is minted there: docs/decisions.md "Shared pools"), so the
-- script names it from the child's key.

-- pool_of reads the pool argument (engine.PoolArg) of the child whose
-- account key is akey: nil without a parent, else {key, id} and, with a
-- draw limit whose window holds now, {f, from, to, lim, drawn}.
local function pool_of(akey, arg, now)
  if not arg or arg == '' then return nil end
  local id, rest = string.match(arg, '^([0-9a-f-]+)(.*)$')
  if not id or #id ~= 36 then return nil end
  local p = {id = id, key = string.sub(akey, 1, #akey - 36) .. id, lim = nil}
  local f, from, to, lim = string.match(rest, '^|([^|]+)|(%d+)|(%d+)|(%d+)$')
  if f and tonumber(from) <= now and now < tonumber(to) then
    p.f, p.from, p.to, p.lim, p.drawn = f, tonumber(from), tonumber(to), m_parse(lim), MONEY_ZERO
    local sf, ss = string.match(redis.call('HGET', akey, f) or '', '^(%d+) (%d+)')
    if sf and tonumber(sf) >= p.from then p.from, p.drawn = tonumber(sf), m_parse(ss) end
  end
  return p
end

-- pool_free is what account a's blocks may pay for metric beyond its
-- holds, up to need, never negative: own tells the child (its effective
-- balance before its debt, which its line backs) from the parent (its
-- effective balance net of its debt: a child never draws a parent's line).
local function pool_free(a, now, metric, need, own)
  local _, _, eff = acct_bal(a, now)
  local free = eff
  if own then free = m_add(eff, a.d) end
  if a.scoped then free = m_min(free, scope_free(a, now, metric, MONEY_ZERO, nil, need)) end
  if not m_pos(free) then return MONEY_ZERO end
  return m_min(free, need)
end

-- pool_split decides a charge of cost for metric by child a with pool p
-- (pool_of, its parent's account read into p.a): what the child's blocks
-- pay, what goes on its credit line (lim, under block only) and what the
-- parent's blocks pay, in that order of asking: own blocks, the parent,
-- the line. nil when refusing (policy block) and the three fall short of
-- cost; under allow and notify the rest is overage.
local function pool_split(a, p, now, metric, eff, cost, lim, refusing)
  local own = pool_free(a, now, metric, cost, refusing)
  local need = m_sub(cost, own)
  local pooled = MONEY_ZERO
  if m_pos(need) then
    pooled = pool_free(p.a, now, metric, need, false)
    if p.lim then
      local left = m_sub(p.lim, p.drawn)
      if not m_pos(left) then left = MONEY_ZERO end
      pooled = m_min(pooled, left)
    end
  end
  if not refusing then return own, MONEY_ZERO, pooled end
  local debt = m_sub(need, pooled)
  -- The line backs what the blocks and the pool leave, within what the
  -- child's holds leave of it (eff counts them), as scope_split asks.
  if m_cmp(m_add(m_add(eff, lim), pooled), cost) < 0 or m_cmp(m_add(a.d, debt), lim) > 0 then return nil end
  return own, debt, pooled
end

-- pool_take drains pooled from the parent's blocks (p.a) for the child's
-- charge for metric, and appends the parent's Mutation (kind debit, one
-- pool_draw entry naming the child as its reference; its op id and
-- context are Go's, engine.PoolDraw) to the outbox; with a draw limit it
-- counts the draw in the child's hash (akey).
local function pool_take(akey, outbox, p, m, metric, metric_j, pooled, op, ctx)
  local pa, entries, changed = p.a, {}, {}
  local _, _, before = acct_bal(pa, m.now)
  expire_due(pa, m.now, entries, changed)
  local draws = drain(pa, m.now, pooled, changed, metric)
  entries[#entries + 1] = entry_obj(debit_entry({role = 'main', type = 'pool_draw', metric_j = metric_j,
    ref = m.customer, open = false, delta = nil, src = nil, block = nil, draws = nil}, draws))
  pa.v = pa.v + 1
  acct_commit(p.key, pa, changed, m.now)
  local pm = {op = op, kind = 'debit', tenant = m.tenant, customer = p.id, env = m.env, idem = '""', rh = '',
    now = m.now, ctx = ctx, eb = before}
  redis.call('XADD', outbox, '*', 'm', mutation_json(pm, pa, entries, changed))
  if p.lim then redis.call('HSET', akey, p.f, budget_counter_enc(p.from, m_add(p.drawn, pooled), false)) end
end
