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
  local terms = terms_parse(terms_arg)
  if not terms then return redis.error_reply('BADARG terms') end
  local err
  cost, err = price(terms, actual)
  if not cost then return redis.error_reply(err) end
  -- Under block a cost past the reservation plus the free balance is refused;
  -- under allow and notify (ctx.policy) the commit takes what is there and
  -- the rest is overage, so actual_cost can read higher than what was
  -- collected (docs/spec/interface.md Reservation).
  -- Under block the credit line covers what the reservation and the free
  -- balance do not (line_split; debt is what goes on it).
  local charge, overage, debt = cost, MONEY_ZERO, MONEY_ZERO
  if refuses(ctx) then
    -- Only blocks that apply to the metric pay (prelude scope_split); the
    -- reservation ends, or a partial commit frees the part it settles.
    local freed, skip = held, res_id
    if partial then freed, skip = m_min(cost, held), nil end
    charge, debt = scope_split(a, now, r.metric, effective, held, cost, line_of(ctx), freed, skip)
    if not charge then
      -- The reservation stays as it was.
      refuse(outbox_key, {op = op_id, kind = 'commit', tenant = tenant, customer = customer, env = env,
        now = now, ctx = ctx, eb = effective}, a, usage_json(r.metric, actual, cost, MONEY_ZERO, MONEY_ZERO, true, nil))
      return redis.error_reply('INSUFFICIENT the reservation and the free balance are smaller than the cost')
    end
  else
    local available = m_add(effective, held)
    if not m_pos(available) then available = MONEY_ZERO end
    local freed, skip = held, res_id
    if partial then freed, skip = m_min(cost, held), nil end
    available = scope_avail(a, now, r.metric, available, freed, skip)
    if m_cmp(cost, available) > 0 then charge, overage = available, m_sub(cost, available) end
  end
  local overage_field = nil
  if m_pos(overage) then overage_field = overage end
  local merged, stop = commit_meta(r, meta, stored_res, merged_meta, a.x['r:' .. res_id])
  if not merged then return stop end
  expire_due(a, now, entries, changed)
  if partial and m_cmp(cost, held) < 0 then take = cost end
  a.rs = m_sub(a.rs, take)
  local draws = drain(a, now, charge, changed, r.metric)
  local metric_j = j_str(r.metric)
  local e = debit_entry({role = 'main', type = 'consumption', metric_j = metric_j,
    units_s = units_s, ref = res_id, overage = overage_field}, draws)
  if not line_draw(a, e, debt, draws) then return redis.error_reply('OVERFLOW the debt would not fit in int64') end
  entries[#entries + 1] = entry_obj(e)
  charge = m_add(charge, debt)
  r.meta = merged
  cost_s = m_fmt(cost)
  usage = ',"usage":' .. usage_json_s(metric_j, units_s, cost_s, (charge == cost and cost_s) or m_fmt(charge),
    m_fmt(overage), false, res_id)
else
  expire_due(a, now, entries, changed)
  a.rs = m_sub(a.rs, held)
  entries[#entries + 1] = entry_obj({role = 'main', delta_s = '0', type = 'release', metric = r.metric, ref = res_id})
end

-- After partial commits the reservation's actual units and cost are the totals of
-- every part (the resource's actual_units; this part is the entry's).
local total_units, total_cost = actual, cost
if r.act_units then
  total_units, total_cost = m_add(r.act_units, actual), m_add(r.act_cost or MONEY_ZERO, cost)
  if not m_fits(total_units) or not m_fits(total_cost) then
    return redis.error_reply('OVERFLOW the settled units or cost would not fit in int64')
  end
end
if partial then
  r.act_units, r.act_cost, r.released = total_units, total_cost, m_add(r.released, take)
else
  r.status, r.final, r.act_units, r.act_cost, r.released = 'committed', now, total_units, total_cost, held
end
if total_units == actual then
  res_set(r, 'act_units', units_s)
  res_set(r, 'act_cost', cost_s)
end
if partial then res_update(a, r) else res_put(a, r) end
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
