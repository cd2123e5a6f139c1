-- grants.lua owns what grant.lua decides about a block before it adds it:
-- its scope and cap arguments, when a stack_after block starts, and the
-- answer when the accumulation cap leaves nothing to grant.

-- grant_limits reads a grant's scope (metric keys joined by ",", "" for
-- every metric) and accumulation cap ("" for none) arguments: the scope
-- as the block stores it (",k1,k2,") and the cap, each nil when absent;
-- or nil, nil and the BADARG reply.
local function grant_limits(scope_arg, cap_arg)
  local scope, cap = nil, nil
  if scope_arg ~= '' then
    if string.find(scope_arg, '[|@ ]') then return nil, nil, redis.error_reply('BADARG scope') end
    scope = ',' .. scope_arg .. ','
  end
  if cap_arg ~= '' then
    cap = m_parse(cap_arg)
    if not cap or not m_pos(cap) then return nil, nil, redis.error_reply('BADARG cap') end
  end
  return scope, cap
end

-- stack_after_start is when a stack_after block of account a (key) starts
-- and expires, lasting ms: at the latest expiry of a live block whose
-- metadata matches match (JSON object text), or at now under fallback
-- "now" when none does. With version Go matched the metadata
-- (lua/bounded.go) at that account version and found start ("none": no
-- match). Instead it returns nil and the reply: BADARG without a
-- duration, STALE when the account moved since Go read it, NOMATCH under
-- fallback "reject".
local function stack_after_start(key, a, now, ms, fallback, match, start, version)
  if not ms then return nil, redis.error_reply('BADARG stack_after needs a duration') end
  local latest = nil
  if version then
    if int_parse(version) ~= a.v then return nil, redis.error_reply('STALE the account changed since it was read') end
    latest = int_parse(start)
  else
    -- The latest-expiring match: candidates newest expiry first, so only
    -- the metadata up to the first match is read and decoded.
    local want = cjson.decode(match)
    local cands = {}
    for _, b in ipairs(a.blocks) do
      if b.expires and live(b, now) then cands[#cands + 1] = b end
    end
    table.sort(cands, function(x, y) return x.expires > y.expires end)
    for _, b in ipairs(cands) do
      local text, meta = block_meta(key, b), {}
      if text ~= '' then meta = cjson.decode(text) end
      if meta_matches(meta, want) then
        latest = b.expires
        break
      end
    end
  end
  local starts = now
  if latest then
    starts = latest
  elseif fallback == 'reject' then
    return nil, redis.error_reply('NOMATCH no block matches stack_after.metadata_match')
  end
  return starts, starts + ms
end

-- grant_capped answers a grant the accumulation cap leaves nothing to add
-- to account a (key): with no expiry due (entries empty) a no-op, the op
-- key remembering the Mutation m without entries so a retry stays one;
-- else the Mutation of the due expiries alone.
local function grant_capped(key, outbox, op_key, ttl_ms, m, a, entries, changed, now)
  if #entries == 0 then
    if op_key then redis.call('SET', op_key, mutation_json(m, a, entries, changed), 'PX', ttl_ms) end
    return {'noop', ''}
  end
  a.v = a.v + 1
  acct_commit(key, a, changed, now)
  local json = mutation_json(m, a, entries, changed)
  publish(outbox, op_key, ttl_ms, json)
  return {'new', json}
end
