-- seen.lua owns the seen filter's look-up and insert, shared by the money
-- scripts (replay) and seen_add.lua.
--
-- The seen filter (issue 26: no Postgres before a money call). An op key
-- lives until the persister has committed its operation, then a minute
-- more (engine.OpKeyGrace); before shortening it the persister adds it to
-- the filter of its partition for the current period (seen_add.lua), in
-- the same script. A period's filter is a hash {prefix:pNN}:seen:p<period>
-- of buckets whose values are 4-byte fingerprints of the keys in them,
-- concatenated. A money call whose op key is absent consults the hashes Go
-- names (lua/seen.go seenKeys: this period's and the one before, each as
-- long as the horizon): a fingerprint found means "maybe applied"
-- (MAYBESEEN: the caller asks Postgres, lua/applied.go), none means
-- "certainly new" once the partition's filter is seeded
-- ({prefix:pNN}:seen:from exists: lua/seen.go seeds it from Postgres). A
-- false "maybe" costs one Postgres look-up; a false "new" cannot happen
-- within the horizon (idempotency.SeenHorizon).
--
-- The buckets come in seven tiers, so that a partition pays for the
-- buckets its volume fills: a field costs Redis ~50 B besides its value, so
-- in 4,096 buckets a few hundred keys a period cost ~30 B each (the 24 h
-- window's whole budget per key is 100 B), while few buckets for a busy
-- partition would make every look-up read megabytes. Tier t has 2^b
-- buckets (b = 4, 6, 8, 10, 12, 16, 20 bits of sha1(op key name)) and takes
-- SEEN_TIER_CAP keys (64 per bucket) before the next takes over; the last
-- tier has no cap (64 a bucket at 67 million keys in a partition's
-- period). Tiers 1-4's fields are a letter and the bucket number, tier
-- 5's the first 3 hex digits, tiers 6 and 7's a letter and the first 4 or
-- 5. A key's fingerprint is the same 32 bits in every tier, the 8 hex
-- digits after the first 5, so disjoint from every tier's bucket bits. The
-- tier counts are the fields #1 to #6. A look-up reads a key's buckets
-- with one HMGET per period (two once tier 5 is full: seen_maybe);
-- seen_put reads all seven and the counts.
local SEEN_TIERS = {
  {field = 'w', shift = 256, count = '#1'}, -- 16 buckets: the top 4 of the first 12 bits
  {field = 'x', shift = 64, count = '#2'},  -- 64
  {field = 'y', shift = 16, count = '#3'},  -- 256
  {field = 'z', shift = 4, count = '#4'},   -- 1,024
  {count = '#5'},                           -- 4,096: the first 3 hex digits
  {count = '#6'},                           -- 65,536: 'v' and the first 4
}
local SEEN_TIER_CAP = {1024, 4096, 16384, 65536, 262144, 4194304}

-- seen_fp is the fingerprint of the key whose sha1 hex digest is h: the 4
-- bytes after its first 5 digits. One tonumber of the 8 digits and the
-- bytes cut by arithmetic: each C call costs Redis more than the
-- arithmetic (four tonumber and four string.sub calls did ~6,000 cycles).
local function seen_fp(h)
  local n = tonumber(string.sub(h, 6, 13), 16)
  local d = n % 256
  n = (n - d) / 256
  local c = n % 256
  n = (n - c) / 256
  local b = n % 256
  return string.char((n - b) / 256, b, c, d)
end

-- seen_in reports whether bucket value v (a string) holds fingerprint fp
-- at a 4-byte boundary.
local function seen_in(v, fp)
  local i = 1
  while true do
    local at = string.find(v, fp, i, true)
    if not at then return false end
    if at % 4 == 1 then return true end
    i = at + 1
  end
end

-- seen_fields is the field of the key of digest h in each of tiers 1-5,
-- the 5th at index 5: a function of the digest's first 3 digits alone, so
-- each of the 4,096 is made once and remembered in the library (a tier's
-- field name, a concatenation with a number, cost ~4,000 cycles: every
-- money call with an idempotency key and every key the persister records
-- made four). The tables are only read. At most 4,096 small tables (under
-- 1 MB of Lua heap); a local of the do block, not of the chunk (m_fits').
-- Tiers 6 and 7 have too many buckets to remember: seen_wide names them.
local seen_fields
do
  local FIELDS = {}
  function seen_fields(h)
    local p = string.sub(h, 1, 3)
    local f = FIELDS[p]
    if f then return f end
    local top = tonumber(p, 16)
    f = {}
    for t = 1, 4 do
      local tier = SEEN_TIERS[t]
      f[t] = tier.field .. math.floor(top / tier.shift)
    end
    f[5] = p
    FIELDS[p] = f
    return f
  end
end

-- seen_wide is the field of the key of digest h in tiers 6 and 7.
local function seen_wide(h)
  return 'v' .. string.sub(h, 1, 4), 'u' .. string.sub(h, 1, 5)
end

-- seen_read reads op key k's buckets in period hash wk: the digest, the
-- fields (tiers 6 and 7 at indexes 6 and 7), and HMGET's answer (the seven
-- buckets, then the counts #1-#6).
local function seen_read(wk, k)
  local h = redis.sha1hex(k)
  local f = seen_fields(h)
  local f6, f7 = seen_wide(h)
  f = {f[1], f[2], f[3], f[4], f[5], f6, f7}
  return h, f, redis.call('HMGET', wk, f[1], f[2], f[3], f[4], f[5], f6, f7, '#1', '#2', '#3', '#4', '#5', '#6')
end

-- seen_has reports whether buckets v[from..to] hold fingerprint fp. A
-- bucket not written yet (false: a tier past the partition's volume) costs
-- no call.
local function seen_has(fp, v, from, to)
  for t = from, to do
    local b = v[t]
    if b and seen_in(b, fp) then return true end
  end
  return false
end

-- seen_keys is the filter keys a money script was given from KEYS[from]
-- on (the seeded mark, then the period hashes), nil when none: {keys, from},
-- the script's own KEYS and where the filter's start, not a copy (a table
-- grown key by key was rehashed four times on every money call). A filter
-- that ends before the last key is {keys, from, to} (usage_claim.lua's,
-- several in one call).
local function seen_keys(keys, from)
  if not keys[from] then return nil end
  return {keys, from}
end

-- seen_mark is the partition's seeded mark of seen (seen_keys).
local function seen_mark(seen) return seen[1][seen[2]] end

-- seen_maybe reports whether op key k may name an operation applied
-- before (see above): always when the partition is not seeded (seeded:
-- the value of its mark seen_mark(seen), false or nil when absent). The
-- digest, fields and fingerprint are the same in every period, so they are
-- made once, and each period's HMGET asks only tiers 1-5 and tier 5's
-- count: tiers 6 and 7 hold keys only once tier 5 is full, and a second
-- HMGET asks them then (naming and asking them on every look-up cost a
-- consume ~7,000 Redis instructions, which small partitions never need). Every money call with an
-- idempotency key runs this. On six week hashes it took ~60 µs of a
-- ~330 µs reserve or release after an idle pause (bench/worst.go), hence
-- two periods as long as the horizon instead. When seen_has
-- still called seen_in for buckets not written yet, this look-up of 30
-- buckets was a tenth of the Lua instructions a consume ran
-- (docs/decisions.md "Where a consume's Redis instructions go").
local function seen_maybe(seen, k, seeded)
  if not seeded then return true end
  local h = redis.sha1hex(k)
  local f, fp = seen_fields(h), seen_fp(h)
  local keys = seen[1]
  for i = seen[2] + 1, seen[3] or #keys do
    local v = redis.call('HMGET', keys[i], f[1], f[2], f[3], f[4], f[5], '#5')
    if seen_has(fp, v, 1, 5) then return true end
    if (tonumber(v[6]) or 0) >= SEEN_TIER_CAP[5] then
      local f6, f7 = seen_wide(h)
      if seen_has(fp, redis.call('HMGET', keys[i], f6, f7), 1, 2) then return true end
    end
  end
  return false
end

-- seen_put adds op key k to period hash wk unless it is there already, in
-- the first tier not full.
local function seen_put(wk, k)
  local h, f, v = seen_read(wk, k)
  local fp = seen_fp(h)
  if seen_has(fp, v, 1, 7) then return end
  local t = 7
  for i = 1, 6 do
    if (tonumber(v[7 + i]) or 0) < SEEN_TIER_CAP[i] then
      t = i
      break
    end
  end
  -- The tier's count rides in the same HSET (the script is atomic, so the
  -- count read above is current): one redis.call instead of two.
  if t < 7 then
    redis.call('HSET', wk, f[t], (v[t] or '') .. fp, SEEN_TIERS[t].count, (tonumber(v[7 + t]) or 0) + 1)
  else
    redis.call('HSET', wk, f[t], (v[t] or '') .. fp)
  end
end
