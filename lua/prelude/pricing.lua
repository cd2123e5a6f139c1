-- pricing.lua owns what a charge costs (engine.Price in Lua): the terms
-- Go sends and the price of units under them, so consume, commit and
-- their multi-metric forms price alike.

-- Pricing terms, as lua.termsArg encodes an engine.RuleTerms:
--   cost_type|base_cost|unit_cost|mode|tiers
-- tiers are "up_to:unit_cost:flat_cost" joined by ",", up_to "" for null.
local function terms_parse(s)
  if type(s) ~= 'string' then return nil end
  -- One match for the five fields (a gmatch built a table of them).
  local f = {string.match(s, '^([^|]*)|([^|]*)|([^|]*)|([^|]*)|([^|]*)$')}
  if #f ~= 5 then return nil end
  local t = {kind = f[1], base = m_parse(f[2]), unit = m_parse(f[3]), mode = f[4], tiers = {}}
  if not t.base or not t.unit then return nil end
  if f[5] ~= '' then
    for tier in string.gmatch(f[5] .. ',', '([^,]*),') do
      local up, unit, flat = string.match(tier, '^([^:]*):([^:]*):([^:]*)$')
      if not up then return nil end
      local x = {upto = nil, unit = m_parse(unit), flat = m_parse(flat)}
      if up ~= '' then
        x.upto = m_parse(up)
        if not x.upto then return nil end
      end
      if not x.unit or not x.flat then return nil end
      t.tiers[#t.tiers + 1] = x
    end
  end
  return t
end

-- terms_cached is terms_parse(s), remembered per text in the library
-- (a consume's terms are usually the ones of the call before): the
-- result is only read. Two generations of at most TERMS_CACHE_MAX texts
-- each: a full generation becomes the old one, and a text found there
-- moves back into the new one, so the terms in use survive a turn (one
-- cache emptied whole made every 65th text cost a tenant with many rules
-- a parse of up to 100 tiers, ~1M Redis instructions, on its next call).
-- The generations are locals of a do block, not of the chunk (m_fits').
local terms_cached
do
  local TERMS_CACHE, TERMS_OLD, TERMS_CACHED, TERMS_CACHE_MAX = {}, {}, 0, 64
  function terms_cached(s)
    local t = TERMS_CACHE[s]
    if t then
      if t.big then MONEY_GENERAL.general() end
      return t
    end
    t = TERMS_OLD[s] or terms_parse(s)
    if t and MONEY_GENERAL.on then t.big = true end
    if t and type(s) == 'string' then
      if TERMS_CACHED >= TERMS_CACHE_MAX then TERMS_CACHE, TERMS_OLD, TERMS_CACHED = {}, TERMS_CACHE, 0 end
      TERMS_CACHE[s], TERMS_CACHED = t, TERMS_CACHED + 1
    end
    return t
  end
end

local MONEY_ONE = 1
local PRICE_OVERFLOW = 'OVERFLOW the cost would not fit in int64'

-- price is engine.Price of units under terms t: flat charges base_cost per
-- call; per_unit unit_cost x units; tiered graduated prices each tier's
-- slice plus the flat_cost of every tier reached; tiered volume prices
-- every unit at the first tier whose up_to (inclusive) holds the total,
-- plus that tier's flat_cost. It returns the cost, or nil and an error
-- reply text (OVERFLOW when the cost leaves int64, as Go refuses it).
local function price(t, units)
  if m_cmp(units, MONEY_ONE) < 0 then return nil, 'BADARG units must be >= 1' end
  if t.kind == 'flat' then return t.base end
  if t.kind == 'per_unit' then
    local c = m_mul(t.unit, units)
    if not c then return nil, PRICE_OVERFLOW end
    return c
  end
  if t.kind ~= 'tiered' or #t.tiers == 0 then return nil, 'BADTERMS no price for these terms' end
  if t.mode == 'volume' then
    local tier = t.tiers[#t.tiers]
    for _, cand in ipairs(t.tiers) do
      if cand.upto == nil or m_cmp(units, cand.upto) <= 0 then
        tier = cand
        break
      end
    end
    local c = m_mul(tier.unit, units)
    if not c then return nil, PRICE_OVERFLOW end
    c = m_add(c, tier.flat)
    if not m_fits(c) then return nil, PRICE_OVERFLOW end
    return c
  end
  local total, below = MONEY_ZERO, MONEY_ZERO
  for _, tier in ipairs(t.tiers) do
    if m_cmp(units, below) <= 0 then break end
    local top = units
    if tier.upto and m_cmp(tier.upto, units) < 0 then top = tier.upto end
    local slice = m_sub(top, below)
    if m_pos(slice) then
      local c = m_mul(tier.unit, slice)
      if not c then return nil, PRICE_OVERFLOW end
      total = m_add(total, c)
      if not m_fits(total) then return nil, PRICE_OVERFLOW end
      total = m_add(total, tier.flat)
      if not m_fits(total) then return nil, PRICE_OVERFLOW end
      below = top
    end
  end
  return total
end

-- price_terms prices units at terms sent as text, for a script that parses
-- its terms only when it has units to price (a commit, a top-up): the
-- cost, or nil and the error reply (BADARG for terms that do not parse,
-- else price's). The terms come from terms_cached, as a consume's: a
-- commit under a rule of engine.MaxTiers tiers parsed them on every call.
local function price_terms(s, units)
  local terms = terms_cached(s)
  if not terms then return nil, redis.error_reply('BADARG terms') end
  local cost, err = price(terms, units)
  if not cost then return nil, redis.error_reply(err) end
  return cost
end

-- items_price prices every item ({metric, units, terms}) of a
-- multi-metric call (setting each one's cost) and sums their units and costs; items_j lists them as
-- JSON objects, each with its metric, its units under units_name and its
-- cost under cost_name. Instead (fourth value) the error reply when a
-- price fails or a sum leaves int64.
local function items_price(items, units_name, cost_name)
  local cost, units, parts = MONEY_ZERO, MONEY_ZERO, {}
  for i, it in ipairs(items) do
    local c, err = price(it.terms, it.units)
    if not c then return nil, nil, nil, redis.error_reply(err) end
    cost, units = m_add(cost, c), m_add(units, it.units)
    it.cost = c
    if not m_fits(cost) or not m_fits(units) then return nil, nil, nil, redis.error_reply(PRICE_OVERFLOW) end
    parts[i] = '{"billable_metric_key":' .. j_str(it.metric) .. ',"' .. units_name .. '":' .. m_fmt(it.units) ..
      ',"' .. cost_name .. '":' .. m_fmt(c) .. '}'
  end
  return cost, units, '[' .. table.concat(parts, ',') .. ']'
end
