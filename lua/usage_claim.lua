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
-- Claim and look, of many ids in one call (lua/usage_ids.go UsageIDsClaim;
-- docs/decisions.md "One call for many ids"):
-- KEYS       per id, ARGV[3] keys: its claim
--            {prefix:u:NN}:c:<hash of tenant, environment, id>, then the
--            usage filter of its slot (the seeded mark {prefix:u:NN}:seen:from,
--            then the period hashes newest first)
-- ARGV[1]    'm'
-- ARGV[2]    a fresh claim's TTL in ms
-- ARGV[3]    keys per id (1: the filter is not consulted)
-- ARGV[2+2j] id j's 'c' claim or 'l' look (changes nothing)
-- ARGV[3+2j] id j's customer's 16 bytes (look: unused)
--
-- Release:
-- KEYS[1]    the claim
-- ARGV[1]    'r'
-- ARGV[2]    the customer's 16 bytes
--
-- Forget, of many committed ids in one call (lua/usage_ids.go
-- forgetUsage):
-- KEYS       pairs: a claim, then the period hash of its slot to record the
--            id in
-- ARGV[1]    'f'
-- ARGV[2]    the grace in ms           ARGV[3] the period hashes' TTL in ms
-- ARGV[3+i]  the customer's 16 bytes of pair i
--
-- Reply: claim and look: an array, per id: claim: 0 taken afresh and the
-- filter certainly never saw the id, 2 taken afresh and the filter may
-- have seen it (or was not consulted or not seeded), 1 held for this
-- customer already, else the 16 bytes of the customer holding it; look: 0
-- or 2 as a claim when none holds the id, else the holder's 16 bytes (this
-- customer's too). Release: 1 changed the claim, 0 not. Forget: how many
-- claims it shortened.
local k, op, cust = KEYS[1], ARGV[1], ARGV[2]

if op == 'f' then
  local n, grace, ttl, kept = 0, ARGV[2], ARGV[3], {}
  for i = 1, #KEYS, 2 do
    local ck, wk = KEYS[i], KEYS[i + 1]
    local c = ARGV[3 + (i + 1) / 2]
    seen_put(wk, ck)
    -- Each period hash's TTL once a call, not once an id.
    if not kept[wk] then
      redis.call('PEXPIRE', wk, ttl)
      kept[wk] = true
    end
    local cv = redis.call('GET', ck)
    if cv and string.sub(cv, 1, 16) == c then
      redis.call('SET', ck, c .. 'f', 'PX', grace)
      n = n + 1
    end
  end
  return n
end

if op == 'm' then
  local ttl, w = ARGV[2], tonumber(ARGV[3])
  local out, j = {}, 0
  for i = 1, #KEYS, w do
    j = j + 1
    out[j] = usage_claim_one(KEYS, KEYS[i], ARGV[2 + 2 * j], ARGV[3 + 2 * j], i + 1, i + w - 1, ttl)
  end
  return out
end

local v = redis.call('GET', k)
local holder, state
if v then holder, state = string.sub(v, 1, 16), string.sub(v, 17) end

-- 'r'
if not v or holder ~= cust or state == 'f' then return 0 end
local n = tonumber(state) - 1
if n <= 0 then
  redis.call('DEL', k)
else
  redis.call('SET', k, cust .. n, 'KEEPTTL')
end
return 1
