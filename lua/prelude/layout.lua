-- layout.lua owns account layout v2's spend-order index and kept-reservation
-- order (fields "o" and "k"), which let a money script read only the
-- blocks it drains; the summary ("s") is read by account_read.lua and
-- written by account_commit.lua.

-- Account layout v2 (docs/decisions.md, "Account layout v2"): three fields
-- let a money script touch only what it drains instead of decoding every
-- block and reservation of the hash.
--   "s"  summary: balance|pending|live blocks|active reservations|E|S|F, money and
--        counts in decimal, instants in decimal Unix ms ("" for none): the
--        figures of the live blocks at the instant u of the last write
--        (field "ua"); E the soonest expires_at of a block with credit, S
--        the soonest start after u, F the latest start at or before u. While
--        F <= now < min(E, S) no block has expired or started since, so the
--        summary is exact at now without decoding a block.
--   "o"  spend-order index: every block with credit as
--        "id,priority,expires,created,starts" (instants decimal, expires ""
--        for none), joined by " " in engine.SpendOrder order (spends_before).
--   "k"  kept finalized reservations as "id,finalized" joined by " ", by
--        (finalized, id): pruning reads one field.
-- All three are a function of the hash's blocks and reservations and of u (load.go
-- writes the same from Postgres, so a rebuilt hash is byte for byte the
-- live one). A hash without them (written before layout v2), or with now
-- outside [F, min(E, S)), takes the slow path: acct_read_all, expire what
-- is due, and acct_commit rewrites all three.
-- LAYOUT_MIN_ITEMS: an account of fewer blocks and active reservations than this
-- (kept reservations, at most MAX_KEPT_RESERVATIONS, do not count) goes
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
  -- A block that spends before the first entry (a stack_after fallback, a
  -- short top-priority grant) goes in front after one entry parsed instead
  -- of ~13 (~140k instructions at 100 blocks, lua/profile_worst_test.go).
  -- Only its priority is read first: a block of a later priority (most
  -- grants) pays a short match. The bisection then starts as before (a
  -- first probe inside it made the common append ~60k dearer).
  local first = tonumber(string.match(idx, '^[^,]*,(%d+)'))
  if b.prio < first then return e .. ' ' .. idx end
  if b.prio == first then
    local id, _, exp, created = string.match(idx, '^([^ ,]+),([^,]*),([^,]*),([^,]*)')
    if spends_before(b, {id = id, prio = first, expires = tonumber(exp), created = tonumber(created)}) then
      return e .. ' ' .. idx
    end
  end
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
  -- In front without string.sub(idx, 1): Redis's Lua hashes every byte of a
  -- new string even when it equals one it holds.
  if hi == 1 then return e .. ' ' .. idx end
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

-- kept_of is field "k" text s as a kept list: a fresh array (the caller
-- appends to it and prunes it) of entries {id, finalized, text of the
-- entry}, which are only read. Each text is parsed once and remembered in
-- the library, as terms_cached remembers terms (two generations of at most
-- 512 texts; a text holds at most MAX_KEPT_RESERVATIONS entries): a
-- pattern match per entry cost ~5,000 cycles, and every money call of a
-- large account with finalized reservations read them all
-- (lua/profile_worst_test.go, "reserve/release kept cap"). The memo is a
-- local of the do block, not of the chunk (m_fits').
local kept_of
do
  local KEPT, KEPT_OLD, KEPT_N, KEPT_MAX = {}, {}, 0, 512
  function kept_of(s)
    local m = KEPT[s]
    if not m then
      m = KEPT_OLD[s]
      if not m then
        m = {}
        for id, fin in string.gmatch(s, '([^ ,]+),([^ ]+)') do m[#m + 1] = {id, tonumber(fin), id .. ',' .. fin} end
      end
      if KEPT_N >= KEPT_MAX then KEPT, KEPT_OLD, KEPT_N = {}, KEPT, 0 end
      KEPT[s], KEPT_N = m, KEPT_N + 1
    end
    local out = {}
    for i = 1, #m do out[i] = m[i] end
    return out
  end
end

-- kept_before orders kept reservations {id, finalized}: oldest first, then id.
local function kept_before(x, y)
  if x[2] ~= y[2] then return x[2] < y[2] end
  return str_less(x[1], y[1])
end
