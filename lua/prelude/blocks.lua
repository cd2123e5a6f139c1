-- blocks.lua owns a credit block's encoding, in the account hash and in
-- the Mutation JSON: the one definition every script reads and writes
-- blocks with (lua/load.go writes the same bytes from Postgres).
--
-- Block encoding (the value of field "b:<block id>" of the account hash),
-- seven fields joined by "|":
--   remaining|original|priority|created|starts-created|expires-starts|source
-- money in decimal, original "" while it equals remaining (an untouched
-- block); instants in Unix ms written in base 36 to save memory (created
-- absolute, starts as an offset from created, "" for 0; expires as an offset
-- from starts, "" for no expiry); source as a one-letter code for the known
-- sources (else the text). A block scoped to metrics (docs/rules.md
-- "Credits scoped to metrics") has an eighth field "@" followed by its
-- metric keys joined by "," (keys never hold "|", ",", "@":
-- engine.ValidMetricKey).
--
-- Ids in field names, in the spend-order index and in field "id" are
-- whatever Go handed the script: the 22-character compact form of
-- engine.CompactID. Scripts never look inside an id; Go reads it back
-- (engine.ParseCompactID). Three blocks and the account fields fit in one
-- 224-byte listpack (issue 10). Hashes of the layouts before (UUID text
-- ids, originals always written, metadata inline in an eighth field) are
-- rewritten once before a node of this release serves
-- (lua/layout_fence.go), so no script reads them (issue 29).
--
-- Block metadata lives in its own field "m:<block id>" of the account hash,
-- written once when the block is created and deleted with the block. Every
-- script reads the hash without those fields (acct_read), so a customer's
-- metadata costs a money script nothing (invariant 13), and only the
-- Mutation of the script that creates a block carries its metadata: a drain
-- never copies it into the outbox or an op key.

-- scope_field is the eighth block field of scope s (",k1,k2," as blocks
-- keep it, nil for every metric): "|@k1,k2", or "".
local function scope_field(s)
  if not s then return '' end
  return '|@' .. string.sub(s, 2, -2)
end

-- block_dec reads the block id stored as raw.
-- A block's encoding is the same text from one charge to the next but for
-- the block a charge drains, and every script decodes every block of an
-- account read whole (a small account: most of them), so the library
-- remembers each text's decoded fields (two generations, as terms_cached):
-- one match of eight captures and the base-36 decodes cost ~20,000 Redis
-- instructions a block, a copy of the fields about a third of that. The
-- fields depend on the text alone; each call gets a table of its own (the
-- scripts write to it), and the amounts in it are never written in place.
-- The memos are locals of the do block, not of the chunk (m_fits').
local block_dec, block_seen
do
  local BLK, BLK_OLD, BLK_N, BLK_MAX = {}, {}, 0, 4096
  local function fields(raw)
    -- One match for all fields. rest is "" or "|@keys", the block's scope,
    -- kept as ",k1,k2," (applies finds ",key," in it).
    local rem, orig, prio, c36, s36, e36, src, rest =
      string.match(raw, '^([^|]*)|([^|]*)|([^|]*)|([^|]*)|([^|]*)|([^|]*)|([^|]*)(.*)$')
    local scope = nil
    if rest ~= '' then scope = ',' .. string.sub(rest, 3) .. ',' end
    local created = b36_dec(c36)
    local starts = created
    if s36 ~= '' then starts = created + b36_dec(s36) end
    local expires = nil
    if e36 ~= '' then expires = starts + b36_dec(e36) end
    -- raw: block_enc writes the encoding after the amounts back as read.
    -- The original amount stays text (orig_s, remaining's text when it is
    -- not written out): no script does arithmetic on it.
    local orig_s = orig
    if orig == '' then orig_s = rem end
    -- A one-digit priority (the usual) is read from its byte: tonumber
    -- goes through strtod (~2,400 instructions). prio_s keeps that text
    -- (one digit: as i_fmt writes it) for block_json.
    local p, prio_s = string.byte(prio), nil
    if #prio == 1 and p >= 48 and p <= 57 then p, prio_s = p - 48, prio else p = tonumber(prio) end
    local f = {m_stored(rem), orig_s, p, prio_s, created, starts, expires, src_dec(src), scope, #rem, #orig}
    if MONEY_GENERAL.on then f.big = true end
    return f
  end
  local function remember(raw, f)
    if BLK_N >= BLK_MAX then BLK, BLK_OLD, BLK_N = {}, BLK, 0 end
    BLK[raw], BLK_N = f, BLK_N + 1
  end
  function block_dec(id, raw)
    local f = BLK[raw]
    if not f then
      f = BLK_OLD[raw] or fields(raw)
      remember(raw, f)
    end
    if f.big then MONEY_GENERAL.general() end
    -- Members set later (drain, block_enc) are named (nil): the table is
    -- made at its final size. meta is a block's metadata only when the
    -- script creates it (a read block's stays in field "m:<id>").
    return {id = id, rem = f[1], orig_s = f[2], prio = f[3], prio_s = f[4],
      created = f[5], starts = f[6], expires = f[7], src = f[8], meta = '', scope = f[9],
      raw = raw, rem_len = f[10], orig_len = f[11], rem0 = nil, ix = nil, rem_s = nil, rem_k = nil}
  end
  -- block_seen remembers raw, the new text block_enc wrote for block b read
  -- from the hash (only its amounts move: rem is its remaining amount's
  -- text, orig_len the length of its original amount's field), as
  -- block_dec would decode it; it answers raw.
  function block_seen(raw, b, rem, orig_len)
    if not BLK[raw] then
      local f = {b.rem, b.orig_s, b.prio, b.prio_s, b.created, b.starts, b.expires, b.src, b.scope, #rem, orig_len}
      if MONEY_GENERAL.on then f.big = true end
      remember(raw, f)
    end
    return raw
  end
end

-- block_enc is the hash value of block b (format above).
local function block_enc(b)
  -- A drain changes only the remaining amount: the rest of a block read
  -- from the hash is written back as it was read (b36_enc is a Lua loop).
  -- Original is written out exactly when it differs from remaining (strings
  -- are interned: == is one comparison). The new text of a block read
  -- from the hash is remembered decoded (block_seen) for the next charge.
  local rem = m_fmt(b.rem)
  -- Kept for block_json (b_rem_s), which writes the same amount next.
  b.rem_s, b.rem_k = rem, b.rem
  if b.raw then
    if b.orig_len == 0 then
      if rem == b.orig_s then return b.raw end
      return block_seen(rem .. '|' .. b.orig_s .. string.sub(b.raw, b.rem_len + 2), b, rem, #b.orig_s)
    end
    if rem == b.orig_s then return block_seen(rem .. '|' .. string.sub(b.raw, b.rem_len + 2 + b.orig_len), b, rem, 0) end
    return block_seen(rem .. string.sub(b.raw, b.rem_len + 1), b, rem, b.orig_len)
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

-- block_json is b as an engine.MutationBlock in three parts: the text before
-- its metadata, the metadata (nil when none) and the rest, which
-- mutation_json splices in one concatenation (each new Lua string costs
-- Redis ~11 instructions a byte, and the metadata is up to
-- engine.MaxMetadataBytes). Only a block created by this script (b.fresh)
-- carries its metadata: the persister keeps the metadata Postgres has for a
-- block whose Mutation carries none.
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
  local meta, tail = nil, '}'
  if b.fresh and b.meta ~= '' then meta = b.meta end
  -- The scope never changes: only the Mutation creating the block names
  -- it (keys need no escaping: engine.ValidMetricKey).
  if b.fresh and b.scope then
    tail = ',"scope":["' .. string.gsub(string.sub(b.scope, 2, -2), ',', '","') .. '"]}'
  end
  return '{"id":"' .. b.id .. '","original":' .. (b.orig_s or m_fmt(b.orig)) .. ',"remaining":' .. rem ..
    ',"priority":' .. prio .. ',"source":' .. src_json(b.src) .. ',"starts":' .. starts ..
    ',"expires":' .. exp .. ',"created":' .. created, meta, tail
end
