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
-- Claim, look and release:
-- KEYS[1]    the claim {prefix:u:NN}:c:<hash of tenant, environment, id>
-- KEYS[2..]  claim and look: the usage filter of its slot, when consulted
--            (the seeded mark {prefix:u:NN}:seen, then the week hashes
--            newest first)
-- ARGV[1]    'c' claim, 'l' look (changes nothing), 'r' release
-- ARGV[2]    the customer's 16 bytes (look: unused)
-- ARGV[3]    claim: a fresh claim's TTL in ms
--
-- Forget, of many committed ids in one call (a call's fixed cost was most
-- of a lone forget's; lua/usage_ids.go forgetUsage):
-- KEYS       pairs: a claim, then the week hash of its slot to record the
--            id in
-- ARGV[1]    'f'
-- ARGV[2]    the grace in ms           ARGV[3] the week hashes' TTL in ms
-- ARGV[3+i]  the customer's 16 bytes of pair i
--
-- Reply: claim: 0 taken afresh and the filter certainly never saw the id,
-- 2 taken afresh and the filter may have seen it (or was not consulted or
-- not seeded), 1 held for this customer already, else the 16 bytes of the
-- customer holding it; look: 0 or 2 as a claim when none holds the id,
-- else the holder's 16 bytes (this customer's too); release: 1 changed the
-- claim, 0 not; forget: how many claims it shortened.
local k, op, cust = KEYS[1], ARGV[1], ARGV[2]

if op == 'f' then
  local n, grace, ttl = 0, ARGV[2], ARGV[3]
  for i = 1, #KEYS, 2 do
    local ck, wk = KEYS[i], KEYS[i + 1]
    local c = ARGV[3 + (i + 1) / 2]
    seen_put(wk, ck)
    redis.call('PEXPIRE', wk, ttl)
    local cv = redis.call('GET', ck)
    if cv and string.sub(cv, 1, 16) == c then
      redis.call('SET', ck, c .. 'f', 'PX', grace)
      n = n + 1
    end
  end
  return n
end

local v = redis.call('GET', k)
local holder, state
if v then holder, state = string.sub(v, 1, 16), string.sub(v, 17) end

-- unseen reports whether the usage filter given certainly never saw k.
local function unseen()
  local seen = seen_keys(KEYS, 2)
  return seen ~= nil and not seen_maybe(seen, k, redis.call('GET', seen[1]))
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

-- 'r'
if not v or holder ~= cust or state == 'f' then return 0 end
local n = tonumber(state) - 1
if n <= 0 then
  redis.call('DEL', k)
else
  redis.call('SET', k, cust .. n, 'KEEPTTL')
end
return 1
