-- rollover.lua carries part of a grant's unused credit into a new block when
-- a prepaid subscription renews (docs/spec/addendum.md §6): the listed blocks of the
-- previous cycle expire (one expiry entry each), and floor(their remaining
-- credit * percent / 100) becomes a new block with one main entry. Due
-- blocks expire first, as in every money script.
--
-- KEYS as grant.lua.
-- ARGV[1..8] as grant.lua (now, op id, tenant, env, customer, idem, request
--            hash, op key TTL)
-- ARGV[9]  JSON array of the block ids of the previous cycle
-- ARGV[10] percent to carry, 0-100
-- ARGV[11] new block id           ARGV[12] priority
-- ARGV[13] source                 ARGV[14] block metadata JSON text or ""
-- ARGV[15] expires_at ms or ""    ARGV[16] entry type
-- ARGV[17] entry metadata JSON text or ""
-- ARGV[18] engine.MutationContext JSON text or ""
--
-- Reply: {"new", mutation JSON} (kind "rollover"), {"replay", stored}, or
-- {"noop", ""} when no listed block has credit left and none is due;
-- errors NOSTATE, MISMATCH, TOOMANYBLOCKS (the carried block would pass
-- MAX_LIVE_BLOCKS; nothing written), BADARG.
local account_key, outbox_key, op_key = KEYS[1], KEYS[2], KEYS[3]
local now = int_parse(ARGV[1])
local op_id, tenant, env, customer = ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local idem, request_hash, op_ttl_ms = ARGV[6], ARGV[7], ARGV[8]
local ids, pct = cjson.decode(ARGV[9]), int_parse(ARGV[10])
local block_id, priority, source, new_meta = ARGV[11], int_parse(ARGV[12]), ARGV[13], ARGV[14]
local expires, entry_type, entry_meta, ctx = int_parse(ARGV[15]), ARGV[16], ARGV[17], ARGV[18] or ''

if not now or not pct or pct < 0 or pct > 100 or not priority or type(ids) ~= 'table' then
  return redis.error_reply('BADARG now, percent, priority or block ids')
end

local a = acct_read(account_key, now, {}, true)
if not a then return redis.error_reply('NOSTATE no credit state for the customer') end
local r = replay(op_key, request_hash, seen_keys(KEYS, 4))
if r then return r end

local _, _, effective_before = acct_bal(a, now)
local entries, changed = {}, {}
expire_due(a, now, entries, changed)

local listed = {}
for _, id in ipairs(ids) do listed[id] = true end
local old = {}
for _, b in ipairs(a.blocks) do
  if listed[b.id] and live(b, now) then old[#old + 1] = b end
end
table.sort(old, spends_before)
local unused = MONEY_ZERO
for _, b in ipairs(old) do
  unused = m_add(unused, b.rem)
  entries[#entries + 1] = entry_json('expiry', m_neg(b.rem), 'expiry', b.src, b.id, '', '')
  b.rem = MONEY_ZERO
  changed[#changed + 1] = b
end
if #entries == 0 then return {'noop', ''} end

-- carry = floor(unused * pct / 100) on limbs: unused = hi*1e9 + lo, so
-- unused / 100 = {hi / 100, (hi % 100) * 1e7 + lo / 100} with remainder lo % 100.
local hi, lo = MONEY_GENERAL.limbs(unused)
local q = m_out(math.floor(hi / 100), (hi % 100) * 10000000 + math.floor(lo / 100))
local carry = m_add(m_mul(q, pct), math.floor((lo % 100) * pct / 100))
if m_pos(carry) then
  if live_count(a, now) >= MAX_LIVE_BLOCKS then
    return redis.error_reply('TOOMANYBLOCKS the customer has the most live blocks it may hold')
  end
  -- The carry keeps the scope of the blocks it carries (the first in spend
  -- order when they differ, which blocks of one plan grant never do).
  local block = {id = block_id, rem = carry, orig = carry, prio = priority, created = now,
    starts = now, expires = expires, src = source, meta = new_meta, scope = old[1].scope, fresh = true}
  a.blocks[#a.blocks + 1] = block
  changed[#changed + 1] = block
  entries[#entries + 1] = entry_json('main', carry, entry_type, source, block_id, '', entry_meta)
  -- As grant.lua: the carry pays the debt of the credit line first.
  line_repay(a, block, entries, now)
end

a.v = a.v + 1
acct_commit(account_key, a, changed, now)
local json = mutation_json({op = op_id, kind = 'rollover', tenant = tenant, customer = customer, env = env,
  idem = idem, rh = request_hash, now = now, ctx = ctx, eb = effective_before}, a, entries, changed)
publish(outbox_key, op_key, op_ttl_ms, json)
return {'new', json}
