-- expire.lua records the expiry of every block of one customer whose
-- expires_at is at or before now (one entry per block, kind "expire") and
-- appends the Mutation to the outbox. The expiry sweep calls it.
--
-- KEYS[1]  account hash          {prefix:pNN}:a:<customer>
-- KEYS[2]  partition outbox      {prefix:pNN}:outbox
-- ARGV[1]  now, Unix ms           ARGV[2]  op id
-- ARGV[3]  tenant id              ARGV[4]  environment
-- ARGV[5]  customer id
--
-- Reply: {"new", mutation JSON}, or {"noop", ""} when nothing is due (the
-- account is untouched: Postgres, which lists the customers to sweep,
-- trails Redis, so a customer just expired is often asked again). Error
-- NOSTATE.
local account_key, outbox_key = KEYS[1], KEYS[2]
local now = int_parse(ARGV[1])
local op_id, tenant, env, customer = ARGV[2], ARGV[3], ARGV[4], ARGV[5]

if not now then return redis.error_reply('BADARG now') end

-- The fast path finds the due blocks from the summary and the index
-- alone, so a sweep that asks again costs no read of every block.
local a = acct_read(account_key, now, {})
if not a then return redis.error_reply('NOSTATE no credit state for the customer') end

-- Due blocks already count for nothing, so the effective balance is the
-- same before and after; eb is written for the persister all the same.
local _, _, effective = acct_bal(a, now)
local entries, changed = {}, {}
expire_due(a, now, entries, changed)
if #entries == 0 then return {'noop', ''} end

a.v = a.v + 1
acct_commit(account_key, a, changed, now)
local json = mutation_json({op = op_id, kind = 'expire', tenant = tenant, customer = customer, env = env,
  idem = '""', rh = '', now = now, eb = effective}, a, entries, changed)
publish(outbox_key, nil, nil, json)
return {'new', json}
