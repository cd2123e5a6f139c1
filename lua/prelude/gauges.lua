-- gauges.lua owns a gauge's count and its leases in the account hash and
-- in the Mutation JSON (gauge.lua, lease.lua).
--
-- Gauge leases (gauge.lua, lease.lua): the active leases of gauge <metric>
-- live in field "L:<metric>" of the account hash, entries joined by " ",
-- each "id,amount,expires,created,seconds": the slots it holds, its
-- instants in Unix ms and the length it was last taken or renewed for.
-- A lease whose expires is at or before now holds nothing any more
-- (leases_split): every script that reads the field lapses it, so expiry
-- is exact at read time; the lease sweep only writes the lapse down.
-- Field "g:<metric>" counts the leased slots too. At most
-- MAX_GAUGE_LEASES leases per gauge (TOOMANYLEASES): engine.MaxGaugeLeases.
local MAX_GAUGE_LEASES = 200

-- leases_dec decodes field "L:<metric>" (nil or "" for none).
local function leases_dec(raw)
  local out = {}
  if not raw or raw == '' then return out end
  for id, amt, exp, cr, sec in string.gmatch(raw, '([^, ]+),(%d+),(%d+),(%d+),(%d+)') do
    out[#out + 1] = {id = id, amount = m_stored(amt), expires = tonumber(exp), created = tonumber(cr),
      seconds = tonumber(sec)}
  end
  return out
end

-- leases_enc is the field value of leases ls ("" for none).
local function leases_enc(ls)
  local parts = {}
  for i, l in ipairs(ls) do
    parts[i] = l.id .. ',' .. m_fmt(l.amount) .. ',' .. i_fmt(l.expires) .. ',' .. i_fmt(l.created) .. ',' ..
      i_fmt(l.seconds)
  end
  return table.concat(parts, ' ')
end

-- leases_split parts ls into the leases still active at now and those due
-- (expires at or before now), and sums the slots the active ones hold.
local function leases_split(ls, now)
  local active, due, held = {}, {}, MONEY_ZERO
  for _, l in ipairs(ls) do
    if l.expires <= now then
      due[#due + 1] = l
    else
      active[#active + 1] = l
      held = m_add(held, l.amount)
    end
  end
  return active, due, held
end

-- lease_json is lease l as an engine.MutationLease with status (active,
-- released or expired) and, once it ended, the instant it did.
local function lease_json(l, status, ended)
  local s = '{"id":' .. q(l.id) .. ',"amount":' .. m_fmt(l.amount) .. ',"status":"' .. status ..
    '","expires":' .. i_fmt(l.expires) .. ',"created":' .. i_fmt(l.created) .. ',"seconds":' .. i_fmt(l.seconds)
  if ended then s = s .. ',"ended":' .. i_fmt(ended) end
  return s .. '}'
end

-- gauge_json is the Mutation's gauge section: the count after the change,
-- the cap it was moved under (cap_txt, a decimal text; nil for a lease's
-- renewal or release) and the leases it opened, renewed or ended (JSON
-- texts). The cap rides along so that a retry answers the first call's
-- figures by re-running into the op key, whatever the cap is by then.
local function gauge_json(metric, cur, lease_parts, cap_txt)
  local s = ',"gauge":{"metric":' .. j_str(metric) .. ',"current":' .. m_fmt(cur)
  if cap_txt then s = s .. ',"cap":' .. cap_txt end
  if #lease_parts > 0 then s = s .. ',"leases":[' .. table.concat(lease_parts, ',') .. ']' end
  return s .. '}'
end

-- gauge_write stores gauge metric's count and its active leases (the
-- field leaves the hash with the last one, so an idle gauge costs none);
-- had says whether the hash holds the field now.
local function gauge_write(key, metric, cur, active, had)
  if #active > 0 then
    redis.call('HSET', key, 'g:' .. metric, m_fmt(cur), 'L:' .. metric, leases_enc(active))
  else
    redis.call('HSET', key, 'g:' .. metric, m_fmt(cur))
    if had then redis.call('HDEL', key, 'L:' .. metric) end
  end
end
