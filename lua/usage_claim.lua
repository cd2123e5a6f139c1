-- usage_claim.lua keeps one claim of the tenant index of usage event ids
-- (issue 26, lua/usage_ids.go): an event_id is a usage event's idempotency
-- key per tenant and environment, across customers, so a usage batch
-- claims each event's id for the event's customer before its consume
-- runs, and a claim held for another customer makes the event a reuse.
--
-- A claim is a string: the customer's 16 bytes, then its state: the count
-- of sends of this customer that hold it and have not released it (a
-- decimal), or 'f' once the persister has committed the charge (forget).
-- A send whose consume applied never releases, so the count of an applied
-- id stays at least 1 until forget.
--
-- KEYS[1]    the claim {prefix:u:NN}:c:<hash of tenant, environment, id>
-- KEYS[2..]  claim and look: the usage filter of its slot, when consulted
--            (the seeded mark {prefix:u:NN}:seen, then the week hashes
--            newest first); forget: the week hash to record the id in
-- ARGV[1]    'c' claim, 'l' look (changes nothing), 'r' release,
--            'f' forget
-- ARGV[2]    the customer's 16 bytes (look: unused)
-- ARGV[3]    claim: a fresh claim's TTL in ms; forget: the grace in ms
-- ARGV[4]    forget: the week hash's TTL in ms
--
-- Reply: claim: 0 taken afresh and the filter certainly never saw the id,
-- 2 taken afresh and the filter may have seen it (or was not consulted or
-- not seeded), 1 held for this customer already, else the 16 bytes of the
-- customer holding it; look: 0 or 2 as a claim when none holds the id,
-- else the holder's 16 bytes (this customer's too); release and forget: 1
-- changed the claim, 0 not.
local k, op, cust = KEYS[1], ARGV[1], ARGV[2]
local v = redis.call('GET', k)
local holder, state
if v then holder, state = string.sub(v, 1, 16), string.sub(v, 17) end

-- unseen reports whether the usage filter given certainly never saw k.
local function unseen()
  local seen = seen_keys(KEYS, 2)
  return seen ~= nil and not seen_maybe(seen, k, redis.call('GET', seen_mark(seen)))
end

if op == 'l' then
  if v then return holder end
  if unseen() then return 0 end
  return 2
end

if op == 'c' then
  if not v then
    redis.call('SET', k, cust .. '1', 'PX', ARGV[3])
    if unseen() then return 0 end
    return 2
  end
  if holder ~= cust then return holder end
  if state ~= 'f' then redis.call('SET', k, cust .. (tonumber(state) + 1), 'KEEPTTL') end
  return 1
end

if op == 'f' then
  seen_put(KEYS[2], k)
  redis.call('PEXPIRE', KEYS[2], ARGV[4])
  if not v or holder ~= cust then return 0 end
  redis.call('SET', k, cust .. 'f', 'PX', ARGV[3])
  return 1
end

-- 'r'
if not v or holder ~= cust or state == 'f' then return 0 end
local n = tonumber(state) - 1
if n <= 0 then
  redis.call('DEL', k)
else
  redis.call('SET', k, cust .. n, 'KEEPTTL')
end
return 1
