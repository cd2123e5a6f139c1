-- grant.lua adds one credit block and its ledger entry to a customer, after
-- expiring the blocks that are due, and appends the Mutation to the outbox.
--
-- KEYS[1]  account hash          {prefix:pNN}:a:<customer>
-- KEYS[2]  partition outbox      {prefix:pNN}:outbox
-- KEYS[3]  op key, only with an idempotency key {prefix:pNN}:op:<customer>:<hash>
-- ARGV[1]  now, Unix ms           ARGV[2]  op id
-- ARGV[3]  tenant id              ARGV[4]  environment
-- ARGV[5]  customer id            ARGV[6]  idempotency key as JSON text ("" when none)
-- ARGV[7]  request hash           ARGV[8]  op key TTL in ms
-- ARGV[9]  account id to create   ARGV[10] entry type
-- ARGV[11] reason JSON text or "" ARGV[12] entry metadata JSON text or ""
-- ARGV[13] block id               ARGV[14] amount (decimal, > 0)
-- ARGV[15] priority               ARGV[16] source
-- ARGV[17] block metadata JSON text or ""
-- ARGV[18] expires_at ms or "" (no expiry); ignored with stack_after
-- ARGV[19] stack_after duration ms ("" without stack_after)
-- ARGV[20] stack_after fallback "now" or "reject" ("" without stack_after)
-- ARGV[21] stack_after metadata_match JSON object text
-- ARGV[22] engine.MutationContext JSON text, "" or absent when none
-- ARGV[23] accumulation cap (decimal, > 0), "" or absent when none: the block
--          gets min(amount, cap - balance) and nothing when the balance is at
--          or above the cap
-- ARGV[24] stack_after start Go found (ms) or "none", and ARGV[25] the
--          account version Go read it at (lua/bounded.go); STALE when the
--          version moved. Without them the script matches the metadata
--          itself, which costs milliseconds at the largest metadata.
--          Both "" when absent but ARGV[26] is sent.
-- ARGV[26] the block's scope: metric keys joined by ",", "" or absent for
--          every metric (docs/rules.md "Credits scoped to metrics")
--
-- A block that starts at once first pays the debt of the credit line (field
-- "d"): a debt_repayment entry after the grant's (prelude line_repay); a
-- scoped block does not.
--
-- Reply: {"new", mutation JSON} or {"replay", stored mutation JSON}; with a
-- cap that leaves nothing to grant {"noop", ""} (the idempotency key then
-- remembers a Mutation without entries, so a retry stays a no-op); errors
-- NOSTATE (no account hash), MISMATCH (key used by another request), NOMATCH
-- (stack_after reject without a match), OVERFLOW, TOOMANYBLOCKS (the
-- customer already holds MAX_LIVE_BLOCKS live blocks), BADARG. Nothing is written
-- before every check has passed.
local account_key, outbox_key, op_key = KEYS[1], KEYS[2], KEYS[3]
local now = int_parse(ARGV[1])
local op_id, tenant, env, customer = ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local idem, request_hash, op_ttl_ms = ARGV[6], ARGV[7], ARGV[8]
local account_id, entry_type, reason, entry_meta = ARGV[9], ARGV[10], ARGV[11], ARGV[12]
local block_id, amount, priority, source = ARGV[13], m_parse(ARGV[14]), int_parse(ARGV[15]), ARGV[16]
local new_meta, expires_arg = ARGV[17], ARGV[18]
local stack_ms, stack_fallback, stack_match = int_parse(ARGV[19]), ARGV[20], ARGV[21]
local ctx, cap_arg = ARGV[22] or '', ARGV[23] or ''
local stack_start, stack_version = ARGV[24], ARGV[25]
if stack_version == '' then stack_start, stack_version = nil, nil end
local scope_arg = ARGV[26] or ''
local scope, cap, bad = grant_limits(scope_arg, cap_arg)
if bad then return bad end

if not now or not amount or not m_pos(amount) or not priority then
  return redis.error_reply('BADARG now, amount or priority')
end

-- Matching stack_after metadata in the script needs every block.
local a = acct_read(account_key, now, {'o'}, stack_fallback ~= '' and not stack_version)
if not a then return redis.error_reply('NOSTATE no credit state for the customer') end
local r = replay(op_key, request_hash, seen_keys(KEYS, 4))
if r then return r end

local _, _, effective_before = acct_bal(a, now)
local entries, changed = {}, {}
expire_due(a, now, entries, changed)

local starts, expires = now, int_parse(expires_arg)
if stack_fallback ~= '' then
  starts, expires = stack_after_start(account_key, a, now, stack_ms, stack_fallback, stack_match, stack_start,
    stack_version)
  if not starts then return expires end
end

local m = {op = op_id, kind = 'grant', tenant = tenant, customer = customer, env = env,
  idem = idem, rh = request_hash, now = now, ctx = ctx, eb = effective_before}
local balance = acct_bal(a, now)
if cap then
  -- The cap leaves cap - balance to grant; nothing left: prelude grant_capped.
  local room = m_sub(cap, balance)
  if not m_pos(room) then return grant_capped(account_key, outbox_key, op_key, op_ttl_ms, m, a, entries, changed, now) end
  amount = m_min(amount, room)
end
if live_count(a, now) >= MAX_LIVE_BLOCKS then
  return redis.error_reply('TOOMANYBLOCKS the customer has the most live blocks it may hold')
end
local earned = m_add(a.le, amount)
if not m_fits(m_add(balance, amount)) or not m_fits(earned) then
  return redis.error_reply('OVERFLOW the balance would not fit in int64')
end

if a.id == '' then a.id = account_id end
a.v = a.v + 1
a.le = earned
local block = {id = block_id, rem = amount, orig = amount, prio = priority, created = now,
  starts = starts, expires = expires, src = source, meta = new_meta, scope = scope, fresh = true}
a.blocks[#a.blocks + 1] = block
changed[#changed + 1] = block
entries[#entries + 1] = entry_json('main', amount, entry_type, source, block_id, reason, entry_meta)
-- A block that starts at once pays the debt of the credit line first.
line_repay(a, block, entries, now)

acct_commit(account_key, a, changed, now)
local json = mutation_json(m, a, entries, changed)
publish(outbox_key, op_key, op_ttl_ms, json)
return {'new', json}
