-- release.lua returns what an active reservation still holds (engine.ReleaseCommand): a
-- manual release (status released, allowed past expires_at) or the sweep's
-- expiry (status expired, only once expires_at has passed). One zero-delta
-- "release" entry (ref = reservation id); the reservation leaves the
-- reservation-expiry zset; the Mutation is kind "release".
--
-- KEYS[1..4] as reserve.lua           ARGV[1..9] as reserve.lua
-- ARGV[10] reservation id             ARGV[11] "1" to expire (the sweep), else "0"
--
-- Reply: {"new"|"replay", mutation JSON}; errors NOSTATE, MISMATCH,
-- NOTFOUND, NOTACTIVE, NOTDUE (expire before expires_at). Only the sweep's
-- refusals write, and only to the reservation-expiry zset: a member whose reservation is
-- gone or finalized is removed, one not due yet gets its true score, so the
-- sweep does not pick it again.
local account_key, outbox_key, rexp_key, op_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local now = int_parse(ARGV[1])
local op_id, tenant, env, customer = ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local idem, request_hash, op_ttl_ms, ctx = ARGV[6], ARGV[7], ARGV[8], ARGV[9]
local res_id, expire = ARGV[10], ARGV[11] == '1'

if not now or res_id == '' then return redis.error_reply('BADARG now or reservation id') end

local a = acct_read(account_key, now, {'r:' .. res_id})
if not a then return redis.error_reply('NOSTATE no credit state for the customer') end
local rp = replay(op_key, request_hash, seen_keys(KEYS, 5))
if rp then return rp end

local member = res_member(tenant, env, customer, res_id)
local raw = a.x['r:' .. res_id]
if not raw then
  if expire then redis.call('ZREM', rexp_key, member) end
  return redis.error_reply('NOTFOUND no such reservation')
end
-- Without its metadata (res_dec): a release neither changes it nor copies
-- it into its Mutation; Postgres keeps what the reserve or commit stored.
local r = res_dec(res_id, raw)
if r.status ~= 'active' then
  if expire then redis.call('ZREM', rexp_key, member) end
  return redis.error_reply('NOTACTIVE the reservation is ' .. r.status)
end
if expire and r.expires > now then
  redis.call('ZADD', rexp_key, i_fmt(r.expires), member)
  return redis.error_reply('NOTDUE the reservation expires later')
end

local _, _, effective = acct_bal(a, now)
local entries, changed = {}, {}
expire_due(a, now, entries, changed)
-- After partial commits only what the reservation still holds returns.
local held = res_held(r)
a.rs = m_sub(a.rs, held)
r.status, r.final, r.released = 'released', now, held
if expire then r.status = 'expired' end
res_put(a, r)
-- A multi-metric reservation (metric "") names no metric, as its reserve entry.
local metric = r.metric
if metric == '' then metric = nil end
entries[#entries + 1] = entry_obj({role = 'main', delta_s = '0', type = 'release', metric = metric, ref = res_id})

a.v = a.v + 1
acct_commit(account_key, a, changed, now)
redis.call('ZREM', rexp_key, member)
local json = mutation_json({op = op_id, kind = 'release', tenant = tenant, customer = customer, env = env,
  idem = idem, rh = request_hash, now = now, ctx = ctx, eb = effective, res = r},
  a, entries, changed)
publish(outbox_key, op_key, op_ttl_ms, json)
return {'new', json}
