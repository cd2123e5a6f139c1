-- account_read.lua owns reading the account hash into the table a every
-- money script works on (the fast path from the summary, the slow path
-- from every field), and the figures read from it.

-- acct_field decodes one account hash field into a, but a layout v2
-- field (it only marks a as having them) and a block's or reservation's
-- metadata, which it skips: acct_wanted's test and the decoding in one
-- call, with one look-up and at most one string.byte a field (two calls a
-- field were a tenth of the Lua instructions a consume ran: docs/decisions.md
-- "Where a consume's Redis instructions go").
-- Kinds are told by byte, not by substring: every script reads every
-- field, and each new Lua string costs an allocation and an intern.
local BYTE_COLON, BYTE_B, BYTE_R, BYTE_G, BYTE_M, BYTE_N, BYTE_A = 58, 98, 114, 103, 109, 110, 97
local BYTE_U, BYTE_P = 117, 112

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
  elseif kind == 4 then
    -- Layout v2 fields: rebuilt by acct_commit, never read here.
    a.layout = true
    return
  end
  local k1, k2 = string.byte(f, 1, 2)
  if k2 ~= BYTE_COLON then
    a[f] = v
  elseif k1 == BYTE_B then
    local b = block_dec(string.sub(f, 3), v)
    a.blocks[#a.blocks + 1] = b
    if b.scope then a.scoped = true end
  elseif k1 == BYTE_R then
    -- Reservations stay encoded until a script asks for one (res_get).
    a.res[string.sub(f, 3)] = v
    if string.byte(v, 1) == BYTE_A then a.active = a.active + 1 end
  elseif k1 == BYTE_G then
    a.gauges[string.sub(f, 3)] = v
  elseif k1 ~= BYTE_M and k1 ~= BYTE_N then
    a[f] = v
  end
end

-- acct_wanted reports whether acct_field decodes field f of an account
-- hash (the HMGET of acct_read_all asks only for those), marking a as
-- having layout v2 fields as acct_field does.
local function acct_wanted(a, f)
  local kind = ACCT_NAME[f]
  if kind == 4 then
    a.layout = true
    return false
  elseif kind then
    return true
  end
  local k1, k2 = string.byte(f, 1, 2)
  return k2 ~= BYTE_COLON or (k1 ~= BYTE_M and k1 ~= BYTE_N)
end

-- acct_read_all loads the account hash but its metadata fields: nil when
-- it is missing (NOSTATE). HKEYS then HMGET (in slices, under unpack's
-- limit) instead of HGETALL, so metadata is never copied into the script;
-- but a small hash (whole: acct_read's HLEN or acct_listpack, an account
-- whose metadata is a few fields at most, or a few short ones) in one
-- HGETALL, a redis.call fewer on the most common account.
-- The slow path of acct_read: every block decoded, every reservation counted.
-- plain names the extras acct_read answers with a field's raw value (nil
-- for none): they ride in this read, HGETALL's answer or the HMGET, as
-- a.x[name], instead of an HGET each after it (a commit's "n:<id>" on
-- every slow-path account: docs/decisions.md "A commit's reads").
local function acct_read_all(key, whole, plain)
  local kv, names = nil, nil
  if whole then
    kv = redis.call('HGETALL', key)
    if #kv == 0 then return nil end
  else
    names = redis.call('HKEYS', key)
    if #names == 0 then return nil end
  end
  -- The members set later are named too (nil), so the table is made at
  -- its final size: each growth past a power of two rehashes every member.
  local a = {key = key, id = '', t = '', e = '', v = 0, rs = MONEY_ZERO, le = MONEY_ZERO, d = MONEY_ZERO,
    d_stored = nil, ua = 0, blocks = {},
    res = {}, res_dirty = {}, res_meta = {}, gauges = {}, active = 0, kept = {}, x = {}, layout = nil,
    le_s = nil, le_k = nil, v_s = nil, v_n = nil, bal = nil, pend = nil, nlive = nil, nblocks = nil,
    exp_min = nil, start_min = nil, start_max = nil, rs_stored = nil, bal_s = nil, bal_k = nil, nf = nil}
  if kv then
    -- HGETALL's answer read in place, names at odd indexes: split into
    -- two lists, each grown one field at a time, it rehashed both at every
    -- power of two.
    for i = 1, #kv, 2 do
      local f, v = kv[i], kv[i + 1]
      acct_field(a, f, v)
      if plain and plain[f] then a.x[f] = v end
    end
    a.nf = #kv / 2
  else
    -- dec[i] is false for a field read only as a plain extra.
    local want, dec = {}, {}
    for _, f in ipairs(names) do
      if acct_wanted(a, f) then
        want[#want + 1], dec[#want + 1] = f, true
      elseif plain and plain[f] then
        want[#want + 1], dec[#want + 1] = f, false
      end
    end
    for first = 1, #want, 1000 do
      local last = math.min(first + 999, #want)
      local got = redis.call('HMGET', key, unpack(want, first, last))
      for i = first, last do
        local f, v = want[i], got[i - first + 1]
        if dec[i] then acct_field(a, f, v) end
        if plain and plain[f] then a.x[f] = v or nil end
      end
    end
  end
  for id, raw in pairs(a.res) do
    local final = res_final(raw)
    if final then a.kept[#a.kept + 1] = {id, final} end
  end
  return a
end

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

-- acct_read loads what a money script needs of the account hash: nil when
-- it is missing (NOSTATE). On the fast path (acct_read_summary) one HMGET
-- of the account fields, the summary, the kept list and extras (field
-- names the script needs, as a.x[name], nil when absent; "o", the index,
-- only for a script that drains or adds a block: a long string costs a
-- hash of every byte) and no block: a.fast, a.bal, a.pend, a.nlive, a.idx;
-- drain then reads only the blocks it takes.
-- full (or a hash the summary does not cover at now) reads every block
-- (acct_read_all).
-- Its helpers are locals of the do block below, not of the chunk: a money
-- script linked with the prelude (link.go) sits near Lua's 200 locals.
local acct_read
do
  -- acct_listpack reports whether Redis keeps hash key as a listpack (a
  -- ziplist before Redis 7): while it has at most hash-max-listpack-entries
  -- fields of at most hash-max-listpack-value bytes each (128 and 64 by
  -- default, docs/operations.md), so that HGETALL copies a few kilobytes at
  -- most, metadata included. False where OBJECT is not served (miniredis).
  local function acct_listpack(key)
    local enc = redis.pcall('OBJECT', 'ENCODING', key)
    return enc == 'listpack' or enc == 'ziplist'
  end

  -- acct_refresh brings a, read on the fast path from a summary written at
  -- u, to now once time moved past E or S since that clean write: blocks due
  -- at now leave the figures (expire_due zeroes them: a.due); blocks started
  -- in (u, now] leave pending. Only they are read.
  local function acct_refresh(a, key, now, u)
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

  -- acct_read_summary is acct_read's fast path: one HMGET of the account
  -- fields, the summary, the kept list and extras; nil when the hash has no
  -- summary that covers now (or no index for a script that asked for it),
  -- for the slow path to read it whole.
  local function acct_read_summary(key, now, extras, scoped_fast)
    -- Field "sc" counts the scoped blocks of a hash: its money scripts
    -- read every block (scope_free), so it takes the slow path; but for a
    -- script that handles it (scoped_fast: consume.lua, scope_fast) while
    -- no reservation is active, when the spend order alone decides.
    local v = redis.call('HMGET', key, 'id', 'v', 'rs', 'le', 'ua', 's', 'k', 'd', 'sc', unpack(extras))
    local whole = v[2] and v[6] and v[7] and (not v[9] or scoped_fast)
    for i, name in ipairs(extras) do
      if name == 'o' and not v[9 + i] then whole = false end
    end
    if not whole then return nil end
    local bal, tail, pend, nlive, nact, e, st, f =
      string.match(v[6], '^([^|]*)|(([^|]*)|([^|]*)|([^|]*)|([^|]*)|([^|]*)|([^|]*))$')
    e, st, f = tonumber(e), tonumber(st), tonumber(f)
    local u = tonumber(v[5] or '0')
    -- E past u too: a write that left due blocks (gauge expires
    -- nothing) is never trusted, even by a clock behind it.
    local fast = bal and (f == nil or f <= now) and (e == nil or (now < e and u < e)) and (st == nil or now < st)
    if v[9] and nact ~= '0' then fast, bal = false, nil end
    -- Time moved past E or S since a clean write: acct_refresh reads just
    -- the blocks that expired or started.
    local refresh = not fast and bal and u <= now and (e == nil or u < e)
    if not (fast or refresh) then return nil end
    -- Members set later are named (nil): the table is made at its final
    -- size (acct_read_all).
    local a = {fast = true, key = key, id = v[1] or '', v = tonumber(v[2]), rs = MONEY_ZERO, le = MONEY_ZERO,
      d = MONEY_ZERO, d_stored = nil,
      ua = u, blocks = {}, res = {}, res_dirty = {}, res_meta = {}, kept = {}, x = {},
      bal = m_stored(bal), pend = m_stored(pend), nlive = tonumber(nlive), active = tonumber(nact),
      exp_min = e, start_min = st, start_max = f, nblocks = nil, rs_stored = nil, le_s = nil, le_k = nil,
      s_tail = nil, idx = nil, v_s = nil, v_n = nil, bal_s = nil, bal_k = nil}
    -- The summary past the balance as read, with the values it stands
    -- for: acct_commit writes it back as is when none moved.
    a.s_tail = {tail, a.pend, a.nlive, a.active, e, st, f}
    -- A scoped hash without reservations read by a scoped_fast script.
    a.sc_fast, a.sc_n = v[9] and true or nil, v[9] and tonumber(v[9]) or nil
    -- Every block of the index is live at u (E is past u).
    a.nblocks = a.nlive
    if v[3] then a.rs, a.rs_stored = m_parse(v[3]), true end
    if v[8] then a.d, a.d_stored = m_parse(v[8]), true end
    if v[4] then a.le = m_parse(v[4]) a.le_s, a.le_k = v[4], a.le end
    a.kept = kept_of(v[7])
    for i, name in ipairs(extras) do a.x[name] = v[9 + i] or nil end
    a.idx = a.x.o
    if refresh then acct_refresh(a, key, now, u) end
    return a
  end

  -- WHOLE remembers the account keys this node's last read took whole
  -- (at most WHOLE_MAX, then it starts over): their next read skips the
  -- HLEN, a redis.call on every money call of a small account. It only
  -- picks how to read: HGETALL reads any hash right, so a key whose hash
  -- grew since costs one whole read, after which it is forgotten (its
  -- metadata would be copied on every call). Not a function of a text,
  -- unlike the memos of docs/decisions.md "Texts the library remembers
  -- across calls": a hint, never an answer.
  -- A key's entry is true, or the field count at which its hash was last
  -- found a listpack (acct_listpack) when it has LAYOUT_MIN_ITEMS + 5
  -- fields or more: Redis turns a listpack hash into a table and never
  -- back, so such a key is asked again only when it has more fields than
  -- then, or on one read in WHOLE_RECHECK of such keys (a value grown past
  -- hash-max-listpack-value leaves the count as it was). The OBJECT call
  -- was a redis.call on every commit of a reserving customer, whose kept
  -- reservations take it past the count.
  local WHOLE, WHOLE_N, WHOLE_MAX, WHOLE_RECHECK, WHOLE_READS = {}, 0, 16384, 16, 0

  function acct_read(key, now, extras, full, scoped_fast)
    -- HLEN first (O(1)): a hash of fewer fields than the account fields and
    -- LAYOUT_MIN_ITEMS blocks or reservations has no layout v2 fields, so it goes
    -- straight to the slow path, which is short for it: one HGETALL.
    -- So does a longer hash Redis keeps as a listpack (acct_listpack),
    -- whatever its field count: the kept reservations of a reserving
    -- customer (which LAYOUT_MIN_ITEMS does not count) took it past the
    -- count to a summary HMGET that found no summary, then HKEYS and an
    -- HMGET of every field.
    local hinted = WHOLE[key]
    local whole = hinted
    if not whole then
      local n = redis.call('HLEN', key)
      whole = n < LAYOUT_MIN_ITEMS + 5 or (acct_listpack(key) and n)
      if whole then
        if WHOLE_N >= WHOLE_MAX then WHOLE, WHOLE_N = {}, 0 end
        WHOLE[key], WHOLE_N = whole, WHOLE_N + 1
      end
    end
    if not (full or whole) then
      local a = acct_read_summary(key, now, extras, scoped_fast)
      if a then return a end
    end
    -- The extras the read's own tables do not answer: the slow path
    -- rebuilds the index ("o"); the rest ride in acct_read_all's read.
    local plain = nil
    for _, name in ipairs(extras) do
      local k1, k2 = string.byte(name, 1, 2)
      if name ~= 'o' and not (k2 == BYTE_COLON and (k1 == BYTE_R or k1 == BYTE_G or k1 == BYTE_U or k1 == BYTE_P)) then
        plain = plain or {}
        plain[name] = true
      end
    end
    local a = acct_read_all(key, whole, plain)
    if not a then return nil end
    -- A remembered key whose hash is no longer one acct_read would read
    -- whole: the next read asks HLEN again.
    if hinted and a.nf >= LAYOUT_MIN_ITEMS + 5 then
      WHOLE_READS = WHOLE_READS + 1
      if hinted == true or a.nf > hinted or WHOLE_READS % WHOLE_RECHECK == 0 then
        if acct_listpack(key) then WHOLE[key] = a.nf else WHOLE[key] = nil end
      end
    end
    for _, name in ipairs(extras) do
      local k1, k2 = string.byte(name, 1, 2)
      if k2 == BYTE_COLON and k1 == BYTE_R then
        a.x[name] = a.res[string.sub(name, 3)]
      elseif k2 == BYTE_COLON and k1 == BYTE_G then
        a.x[name] = a.gauges[string.sub(name, 3)]
      elseif k2 == BYTE_COLON and (k1 == BYTE_U or k1 == BYTE_P) then
        -- A budget's or the draw limit's counter: acct_read_all kept it.
        a.x[name] = a[name]
      end
    end
    return a
  end
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
