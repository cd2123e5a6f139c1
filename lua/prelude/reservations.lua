-- reservations.lua owns a reservation's encoding in the account hash and
-- in the Mutation JSON, and how a script stores a reservation back into the
-- account it read, so the reservation scripts share one format.

-- Reservation encoding (the value of field "r:<reservation id>"), eleven
-- fields joined by "|", the last one free text:
--   status|est units|est cost|expires|created|finalized|actual units|actual cost|released|metric|meta
-- status one letter (a active, c committed, r released, e expired); money
-- and units in decimal; instants in Unix ms base 36 (finalized "" while
-- active); actual units and cost "" until committed or partially
-- committed (while active: the units and cost settled so far; once
-- committed: the totals of every part); released, while active, the part
-- of est cost partial commits took from the reservation (0 without one), once
-- finalized the money the final commit, release or expiry returned; metric a metric key (never holds "|"); meta "" (hashes
-- of the layouts before issue 10 kept the metadata JSON here; they are
-- rewritten once before a node of this release serves: lua/layout_fence.go):
-- a reservation's metadata lives in field "n:<reservation id>", which
-- acct_read skips like block metadata. A finalized reservation stays RES_KEEP_MS,
-- so a quick second commit or release answers 409 without Postgres; after
-- that the engine reads the final status from Postgres. Kept short: every
-- script on the account reads every field of its hash.
local RES_KEEP_MS = 10 * 60 * 1000
local RES_CODE = {active = 'a', committed = 'c', released = 'r', expired = 'e'}
local RES_NAME = {a = 'active', c = 'committed', r = 'released', e = 'expired'}

-- A reservation table r carries, beside its values, text already at hand for
-- them (res_txt): t.<name> is the text of r.<name> while k.<name> is that
-- same value (a script that replaces the value leaves a stale text
-- unused). res_dec keeps the stored texts, the scripts add the texts Go
-- sent, so each number is parsed and formatted at most once: tonumber or
-- sprintf cost ~2,500 instructions, b36_enc a Lua loop.
local function res_txt(r, name, fmt)
  local v, k = r[name], r.k
  -- A reservation table without texts (k nil) is formatted every time.
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

-- now_b36 is b36_enc(n), remembering the last instant it wrote for
-- res_enc (a reservation's created and finalized instants are its
-- script's now) in B36_N, B36_S, locals of a do block (money.lua's m_fits).
local now_b36
do
  local B36_N, B36_S = nil, nil
  function now_b36(n)
    if n ~= B36_N then B36_N, B36_S = n, b36_enc(n) end
    return B36_S
  end
end

local function res_dec(id, raw)
  local p, pos = {}, 1
  -- The eleventh field, meta, is always "": res_get reads field "n:<id>".
  for i = 1, 10 do
    local j = string.find(raw, '|', pos, true)
    p[i] = string.sub(raw, pos, j - 1)
    pos = j + 1
  end
  local eu, ec, ex, cr, rel = m_parse(p[2]), m_parse(p[3]), b36_dec(p[4]), b36_dec(p[5]), m_parse(p[9])
  local r = {id = id, status = RES_NAME[p[1]], est_units = eu, est_cost = ec,
    expires = ex, created = cr, released = rel, metric = p[10],
    meta = '', final = nil, act_units = nil, act_cost = nil, items = nil, meta_n = nil,
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

-- res_get decodes the reservation id stored as raw with its metadata (field
-- "n:<id>", which acct_read read as an extra).
local function res_get(a, id, raw)
  local r = res_dec(id, raw)
  r.meta = a.x['n:' .. id] or ''
  -- As field "n:<id>" holds it: res_put does not write it back unchanged.
  r.meta_n = r.meta
  return r
end

-- res_put stores reservation r in a, to be written by acct_commit with its
-- metadata.
local function res_put(a, r)
  -- Metadata as field "n:<id>" already holds it (res_get) is not written
  -- again: a commit without metadata would copy every byte of it.
  local meta = r.meta
  if meta == r.meta_n then meta = '' end
  a.res[r.id], a.res_dirty[r.id], a.res_meta[r.id] = res_enc(r), true, meta
  -- Every res_put either opens a reservation (reserve) or finalizes an active
  -- one (commit, release): the active count and the kept list follow.
  if r.status == 'active' then
    a.active = a.active + 1
  else
    a.active = a.active - 1
    a.kept[#a.kept + 1] = {r.id, r.final}
    a.kept_moved = true
  end
end

-- res_update stores active reservation r in a again after an extend or a partial
-- commit: it stays active, so the active count and the kept list stay.
local function res_update(a, r)
  local meta = r.meta
  if meta == r.meta_n then meta = '' end
  a.res[r.id], a.res_dirty[r.id], a.res_meta[r.id] = res_enc(r), true, meta
end

-- res_held is what active reservation r still holds: its estimated cost less what
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
  -- A multi-metric reservation's item list (JSON text), set by reserve_multi.lua
  -- and commit_multi.lua only: Redis does not store it.
  if r.items then items = ',"items":' .. r.items end
  return '{"id":"' .. r.id .. '","metric":' .. j_str(r.metric) .. ',"est_units":' .. res_txt(r, 'est_units', m_fmt) ..
    ',"est_cost":' .. res_txt(r, 'est_cost', m_fmt) .. au .. ac .. ',"released":' .. rel ..
    ',"status":"' .. r.status .. '","expires":' .. res_txt(r, 'expires', i_fmt) ..
    ',"created":' .. res_txt(r, 'created', i_fmt) .. fin .. items
end

-- res_final is when the encoded reservation was finalized (ms), nil while
-- it is active: one pattern match, not a whole res_dec, because every
-- slow-path read checks every kept reservation. A function of the text
-- alone, remembered across calls as block_dec's texts (two generations of
-- 2,048 texts, ~200 B each): a finalized reservation's text stays as it is
-- while it is kept, and the match cost ~3,000 instructions a text on every
-- call (docs/decisions.md "A commit's reads").
local res_final
do
  local FIN, FIN_OLD, FIN_N, FIN_MAX = {}, {}, 0, 2048
  function res_final(raw)
    if string.byte(raw, 1) == 97 then return nil end -- 'a': active
    local fin = FIN[raw]
    if fin == nil then
      fin = FIN_OLD[raw]
      if fin == nil then
        local f = string.match(raw, '^[^|]*|[^|]*|[^|]*|[^|]*|[^|]*|([^|]*)|')
        fin = f and f ~= '' and b36_dec(f) or false
      end
      if FIN_N >= FIN_MAX then FIN, FIN_OLD, FIN_N = {}, FIN, 0 end
      FIN[raw], FIN_N = fin, FIN_N + 1
    end
    return fin or nil
  end
end

-- res_member is the partition reservation-expiry zset member of a reservation.
local function res_member(tenant, env, customer, id)
  return tenant .. '|' .. env .. '|' .. customer .. '|' .. id
end
