-- expire.lua records the expiry of every block of one customer whose
-- expires_at is at or before now (one entry per block, kind "expire") and
-- appends the Mutation to the outbox. The expiry sweep calls it.
--
-- KEYS[1]  account hash          {prefix:pNN}:a:<customer>
-- KEYS[2]  partition outbox      {prefix:pNN}:outbox
-- KEYS[3]  partition expiry zset {prefix:pNN}:exp
-- ARGV[1]  now, Unix ms           ARGV[2]  op id
-- ARGV[3]  tenant id              ARGV[4]  environment
-- ARGV[5]  customer id
--
-- Reply: {"new", mutation JSON}, or {"noop", ""} when nothing is due (the
-- account is untouched; only a stale expiry zset score is corrected, so the
-- sweep does not pick the customer again). Error NOSTATE.
local account_key, outbox_key, expiry_key = KEYS[1], KEYS[2], KEYS[3]
local now = int_parse(ARGV[1])
local op_id, tenant, env, customer = ARGV[2], ARGV[3], ARGV[4], ARGV[5]

if not now then return redis.error_reply('BADARG now') end

local a = acct_read(account_key, now, {}, true)
if not a then return redis.error_reply('NOSTATE no credit state for the customer') end

local member = tenant .. '|' .. env .. '|' .. customer
-- Due blocks already count for nothing, so the effective balance is the
-- same before and after; eb is written for the persister all the same.
local _, _, effective = acct_bal(a, now)
local entries, changed = {}, {}
expire_due(a, now, entries, changed)
if #entries == 0 then
  zset_sync(expiry_key, member, a.blocks)
  return {'noop', ''}
end

a.v = a.v + 1
acct_commit(account_key, expiry_key, member, a, changed, now)
local json = mutation_json({op = op_id, kind = 'expire', tenant = tenant, customer = customer, env = env,
  idem = '""', rh = '', now = now, eb = effective}, a, entries, changed)
publish(outbox_key, nil, nil, json)
return {'new', json}
