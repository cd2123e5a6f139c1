-- commit.lua settles an active reservation at its actual units
-- (engine.CommitCommand), priced at the terms current at commit.
--
-- Actual units 0: the whole reservation returns, one zero-delta "release" entry,
-- no usage; the status is still committed. Actual units > 0: the cost may
-- use the reservation plus the free effective balance (the effective balance with
-- the reservation released, and under block the credit line: prelude line_split);
-- when it does not fit, under block (ctx.policy) it is
-- INSUFFICIENT and nothing changes (the reservation stays active; the outbox gets
-- a refusal record for credit.exhausted, as consume.lua's), under allow and
-- notify the charge is what fits and the rest is overage. Then the reservation
-- returns and the charge is drained from the started blocks in spend order:
-- ONE consumption entry (metric, actual units, ref = reservation id, the
-- overage; the block when one paid, else draws per block; a zero delta
-- when nothing is drained),
-- usage {cost, charged, overage, reservation}. Metadata
-- given with units > 0 is merged into the stored metadata (key by key).
-- The reservation leaves the reservation-expiry zset; the Mutation is kind "commit".
--
-- A partial commit (ARGV[14] "1", units >= 1) charges the same way and
-- writes the same entry, usage and Mutation kind, but keeps the reservation open:
-- the reservation shrinks by the cost (at most what it still holds: r.released
-- counts what partial commits took), the units and cost add to the
-- settled totals (act_units, act_cost while active), the expiry stays.
-- The final commit's units are those of its own part: act_units becomes
-- the total of every part, and only what the reservation still held returns.
--
-- KEYS[1..4] as reserve.lua           ARGV[1..9] as reserve.lua
-- ARGV[10] reservation id             ARGV[11] actual units (>= 0)
-- ARGV[12] pricing terms ("" allowed with 0 units)
-- ARGV[13] metadata JSON text or ""     ARGV[14] "1" partial, else "0"
-- ARGV[15] the reservation's field "r:<id>" as Go read it with its stored
--          metadata, and ARGV[16] ARGV[13] merged into that metadata by Go
--          (both absent: the script merges, which costs milliseconds at
--          the largest metadata; ARGV[13] then "" is fine); STALE when the
--          field is no longer ARGV[15]
--
-- Reply: {"new"|"replay", mutation JSON}; errors NOSTATE, MISMATCH,
-- NOTFOUND (no such reservation for the customer), NOTACTIVE (already
-- committed, released or expired), EXPIRED (expires_at reached, not yet
-- swept), INSUFFICIENT, OVERFLOW, BADTERMS, BADARG.
local account_key, outbox_key, rexp_key, op_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local now = int_parse(ARGV[1])
local op_id, tenant, env, customer = ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local idem, request_hash, op_ttl_ms, ctx = ARGV[6], ARGV[7], ARGV[8], ARGV[9]
local res_id, actual, terms_arg, meta = ARGV[10], m_parse(ARGV[11]), ARGV[12], ARGV[13]
local partial = ARGV[14] == '1'

if not now or not actual or m_cmp(actual, MONEY_ZERO) < 0 or res_id == '' or (partial and not m_pos(actual)) then
  return redis.error_reply('BADARG now, reservation id or actual units')
end

local stored_res, merged_meta = ARGV[15], ARGV[16]
local a, r, reply = commit_open(account_key, now, res_id, m_pos(actual), op_key, request_hash, seen_keys(KEYS, 5),
  merged_meta ~= nil)
if reply then return reply end
-- A multi-metric reservation (metric "") is settled by commit_multi.lua.
if r.metric == '' then return redis.error_reply('BADARG the reservation holds several metrics') end

local _, _, effective = acct_bal(a, now)
local held = res_held(r)
local entries, changed = {}, {}
local take = held
local cost, usage = MONEY_ZERO, ''
-- Texts formatted once for the entry, the usage and the reservation (res_txt).
local units_s, cost_s = arg_txt(ARGV[11]) or m_fmt(actual), '0'
if m_pos(actual) then
  local bad
  cost, bad = price_terms(terms_arg, actual)
  if not cost then return bad end
  -- charge is what the blocks pay, debt what goes on the credit line
  -- (prelude commit_split).
  local charge, overage, debt = commit_split(a, now, r, res_id, effective, held, cost, ctx, partial)
  if not charge then
    -- The reservation stays as it was.
    refuse(outbox_key, {op = op_id, kind = 'commit', tenant = tenant, customer = customer, env = env,
      now = now, ctx = ctx, eb = effective}, a, usage_json(r.metric, actual, cost, MONEY_ZERO, MONEY_ZERO, true, nil))
    return redis.error_reply('INSUFFICIENT the reservation and the free balance are smaller than the cost')
  end
  local merged, stop = commit_meta(r, meta, stored_res, merged_meta, a.x['r:' .. res_id])
  if not merged then return stop end
  expire_due(a, now, entries, changed)
  if partial and m_cmp(cost, held) < 0 then take = cost end
  a.rs = m_sub(a.rs, take)
  cost_s, usage = commit_entry(a, now, r, res_id, entries, changed, units_s, cost, charge, overage, debt)
  if not cost_s then return redis.error_reply('OVERFLOW the debt would not fit in int64') end
  r.meta = merged
else
  expire_due(a, now, entries, changed)
  a.rs = m_sub(a.rs, held)
  entries[#entries + 1] = entry_obj({role = 'main', delta_s = '0', type = 'release', metric = r.metric, ref = res_id})
end

-- The reservation's settled figures (prelude commit_settle).
local overflow = commit_settle(a, r, now, actual, cost, take, held, partial, units_s, cost_s)
if overflow then return overflow end
a.v = a.v + 1
acct_commit(account_key, a, changed, now)
-- The budgets count what the commit cost; a commit is never refused by
-- one: the reservation was checked against them (docs/decisions.md
-- "Budgets").
if m_pos(cost) then usage = usage .. budget_count(account_key, (budget_take(account_key, budgets_of(ctx, now), r.metric, cost, nil))) end
if not partial then redis.call('ZREM', rexp_key, res_member(tenant, env, customer, res_id)) end
local json = mutation_json({op = op_id, kind = 'commit', tenant = tenant, customer = customer, env = env,
  idem = idem, rh = request_hash, now = now, ctx = ctx, eb = effective, extra = usage, res = r},
  a, entries, changed)
publish(outbox_key, op_key, op_ttl_ms, json)
return {'new', json}
