-- debit.lua drains an amount from a customer's started blocks in spend order
-- (engine.SpendOrder; the unscoped blocks first), one ledger entry per block touched, after expiring
-- the blocks that are due, and appends the Mutation to the outbox. It decides
-- before any write, so a refused debit changes nothing at all.
--
-- KEYS[1]  account hash          {prefix:pNN}:a:<customer>
-- KEYS[2]  partition outbox      {prefix:pNN}:outbox
-- KEYS[3]  op key, only with an idempotency key {prefix:pNN}:op:<customer>:<hash>
-- ARGV[1]  now, Unix ms           ARGV[2]  op id
-- ARGV[3]  tenant id              ARGV[4]  environment
-- ARGV[5]  customer id            ARGV[6]  idempotency key as JSON text ("" when none)
-- ARGV[7]  request hash           ARGV[8]  op key TTL in ms
-- ARGV[9]  amount (decimal, > 0)  ARGV[10] entry type
-- ARGV[11] entry source, "" for each block's own source
-- ARGV[12] reason JSON text or "" ARGV[13] entry metadata JSON text or ""
-- ARGV[14] engine.MutationContext JSON text, "" or absent when none
--
-- Reply: {"new", mutation JSON} or {"replay", stored mutation JSON}; errors
-- NOSTATE (no account hash), MISMATCH, NOACCOUNT (no money ever moved),
-- INSUFFICIENT (effective balance below the amount), BADARG.
local account_key, outbox_key, op_key = KEYS[1], KEYS[2], KEYS[3]
local now = int_parse(ARGV[1])
local op_id, tenant, env, customer = ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local idem, request_hash, op_ttl_ms = ARGV[6], ARGV[7], ARGV[8]
local amount, entry_type, entry_source = m_parse(ARGV[9]), ARGV[10], ARGV[11]
local reason, entry_meta, ctx = ARGV[12], ARGV[13], ARGV[14] or ''

if not now or not amount or not m_pos(amount) then
  return redis.error_reply('BADARG now or amount')
end

local a = acct_read(account_key, now, {'o'})
if not a then return redis.error_reply('NOSTATE no credit state for the customer') end
local r = replay(op_key, request_hash, seen_keys(KEYS, 4))
if r then return r end
if a.id == '' then return redis.error_reply('NOACCOUNT the customer has no credit account') end

local _, _, effective = acct_bal(a, now)
if m_cmp(effective, amount) < 0 then
  return redis.error_reply('INSUFFICIENT the effective balance is smaller than the amount')
end

local entries, changed = {}, {}
expire_due(a, now, entries, changed)

-- One entry per block drawn, in spend order.
-- With scoped blocks (docs/decisions.md "Credits scoped to metrics") the
-- credit every metric may use goes first, so scoped credit stays for its
-- metrics; and a debit that would leave an active reservation without blocks that
-- apply to it (prelude scope_free's rule) is refused, nothing written yet.
local draws
if a.scoped then
  local function reservation_slack()
    local low = nil
    local hm, at = scope_reservations(a, nil)
    for _, e in ipairs(scope_elig(a, now, hm, at)) do
      local s = m_sub(e, a.rs)
      if not low or m_cmp(s, low) < 0 then low = s end
    end
    return low
  end
  local before = reservation_slack()
  draws = drain(a, now, amount, changed, '')
  local left = amount
  for _, d in ipairs(draws) do left = m_sub(left, d.take) end
  for _, d in ipairs(drain(a, now, left, changed)) do draws[#draws + 1] = d end
  local after = reservation_slack()
  if after and m_cmp(after, MONEY_ZERO) < 0 and m_cmp(after, before) < 0 then
    return redis.error_reply('INSUFFICIENT the amount would leave a reservation without credit that applies to it')
  end
else
  draws = drain(a, now, amount, changed)
end
for _, d in ipairs(draws) do
  local src = entry_source
  if src == '' then src = d.b.src end
  entries[#entries + 1] = entry_json('main', m_neg(d.take), entry_type, src, d.b.id, reason, entry_meta)
end

a.v = a.v + 1
acct_commit(account_key, a, changed, now)
local json = mutation_json({op = op_id, kind = 'debit', tenant = tenant, customer = customer, env = env,
  idem = idem, rh = request_hash, now = now, ctx = ctx, eb = effective}, a, entries, changed)
publish(outbox_key, op_key, op_ttl_ms, json)
return {'new', json}
