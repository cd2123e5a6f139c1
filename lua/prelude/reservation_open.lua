-- reservation_open.lua owns the checks a reservation script runs before it changes
-- anything (the account, the reservation, a replay), so reserve, commit and
-- their multi-metric forms refuse alike.

-- commit_open reads what a commit of reservation res_id needs: the account (and
-- the spend-order index when the commit drains) and the reservation, active and
-- not past expires_at (the reservation ends at that instant exactly, when the
-- sweep may take it). Instead of them it returns (third value) the reply:
-- a replay of op_key, or NOSTATE, NOTFOUND, NOTACTIVE or EXPIRED. merged:
-- Go merged the commit's metadata (commit_meta), which replaces the stored
-- metadata, so that field is not read (up to engine.MaxMetadataBytes,
-- which Redis's Lua hashes byte by byte).
local function commit_open(key, now, res_id, drains, op_key, rh, seen, merged)
  -- The reservation's metadata field with the account: on the summary's path it
  -- rides in the same HMGET (one redis.call less than an HGET after).
  local wants = {'r:' .. res_id}
  if not merged then wants[2] = 'n:' .. res_id end
  if drains then wants[#wants + 1] = 'o' end
  local a = acct_read(key, now, wants)
  if not a then return nil, nil, redis.error_reply('NOSTATE no credit state for the customer') end
  local rp = replay(op_key, rh, seen)
  if rp then return nil, nil, rp end
  local raw = a.x['r:' .. res_id]
  if not raw then return nil, nil, redis.error_reply('NOTFOUND no such reservation') end
  local r = res_get(a, res_id, raw)
  if r.status ~= 'active' then return nil, nil, redis.error_reply('NOTACTIVE the reservation is ' .. r.status) end
  if now >= r.expires then return nil, nil, redis.error_reply('EXPIRED the reservation expired') end
  return a, r
end

-- reserve_open reads what a reserve of reservation res_id needs: the account,
-- with the id not taken and room for one more active reservation. Instead of it
-- it returns (second value) the reply: a replay of op_key, or NOSTATE,
-- BADARG (the id is taken) or TOOMANYRESERVATIONS.
local function reserve_open(key, now, res_id, op_key, rh, seen)
  local a = acct_read(key, now, {'r:' .. res_id})
  if not a then return nil, redis.error_reply('NOSTATE no credit state for the customer') end
  local rp = replay(op_key, rh, seen)
  if rp then return nil, rp end
  if a.x['r:' .. res_id] then return nil, redis.error_reply('BADARG the reservation id is taken') end
  if a.active >= MAX_ACTIVE_RESERVATIONS then
    return nil, redis.error_reply('TOOMANYRESERVATIONS the customer has the most active reservations it may hold')
  end
  return a
end

-- commit_meta is the metadata a commit leaves on reservation r: merged_meta when
-- Go merged (lua/bounded.go; it only checks that Go merged into r's
-- metadata: that r's field "r:<id>", raw, is still stored_res, as Go read
-- it with the metadata in one HMGET, for every script that rewrites a
-- reservation's metadata rewrites that field too), else meta merged here.
-- Instead of it it returns (second value) the reply: STALE, or BADARG for
-- metadata not an object.
local function commit_meta(r, meta, stored_res, merged_meta, raw)
  if merged_meta then
    if raw ~= stored_res then return nil, redis.error_reply('STALE the reservation changed since it was read') end
    return merged_meta
  end
  local merged = meta_merge(r.meta, meta)
  if not merged then return nil, redis.error_reply('BADARG metadata is not a JSON object') end
  return merged
end
