-- items.lua owns the item lists of the multi-metric scripts
-- (consume_multi.lua, commit_multi.lua): reading them from ARGV, checked,
-- and pricing a commit's items with the texts its reservation and usage
-- list them by. ARGV comes as a parameter: a function of the library sees
-- no global ARGV.

-- consume_items reads the n items of a multi-metric consume from argv,
-- three arguments each from ARGV[13] (metric key, units, pricing terms):
-- {metric, units, terms} each, or nil and the BADARG reply.
local function consume_items(argv, n)
  local items = {}
  for i = 1, n do
    local at = 12 + 3 * (i - 1)
    local metric, units, terms = argv[at + 1], m_parse(argv[at + 2]), terms_cached(argv[at + 3])
    if metric == '' or not units or not terms then
      return nil, redis.error_reply('BADARG item metric, units or terms')
    end
    items[i] = {metric = metric, units = units, terms = terms}
  end
  return items
end

-- commit_items reads the n items of a multi-metric commit from argv, five
-- arguments each from ARGV[13] (metric key, estimated units, estimated
-- cost, actual units, pricing terms): the items, their total actual
-- units and their estimates' totals (units, cost: the reservation's when Go
-- sent every item), or nil and the reply (BADARG, or OVERFLOW when the
-- actual units leave int64).
local function commit_items(argv, n)
  local items = {}
  local actual, est_units, est_cost = MONEY_ZERO, MONEY_ZERO, MONEY_ZERO
  for i = 1, n do
    local at = 12 + 5 * (i - 1)
    local it = {metric = argv[at + 1], est_units = m_parse(argv[at + 2]), est_cost = m_parse(argv[at + 3]),
      units = m_parse(argv[at + 4]), terms_arg = argv[at + 5]}
    if it.metric == '' or not it.est_units or not it.est_cost or not it.units or m_cmp(it.units, MONEY_ZERO) < 0 then
      return nil, redis.error_reply('BADARG item metric, estimate or actual units')
    end
    actual = m_add(actual, it.units)
    if not m_fits(actual) then return nil, redis.error_reply(PRICE_OVERFLOW) end
    items[i] = it
  end
  for _, it in ipairs(items) do est_units, est_cost = m_add(est_units, it.est_units), m_add(est_cost, it.est_cost) end
  return items, actual, est_units, est_cost
end

-- commit_items_price prices each item of commit_items with actual units
-- (setting its cost) and returns the total cost, the items as the
-- reservation lists them (res.items: estimate and actual), as the usage
-- and the entry's metadata list them (units and cost) and each item's cost
-- (zero without units); or nil and the error reply. Figures are written
-- as Go sent them (argv) where they are m_fmt's text.
local function commit_items_price(items, argv)
  local cost = MONEY_ZERO
  local res_parts, use_parts, costs = {}, {}, {}
  for i, it in ipairs(items) do
    local c = MONEY_ZERO
    if m_pos(it.units) then
      local terms = terms_cached(it.terms_arg)
      if not terms then return nil, redis.error_reply('BADARG terms') end
      local err
      c, err = price(terms, it.units)
      if not c then return nil, redis.error_reply(err) end
      cost = m_add(cost, c)
      it.cost = c
      if not m_fits(cost) then return nil, redis.error_reply(PRICE_OVERFLOW) end
    end
    local at = 12 + 5 * (i - 1)
    local k, au, ac = j_str(it.metric), arg_txt(argv[at + 4]) or m_fmt(it.units), m_fmt(c)
    res_parts[i] = '{"billable_metric_key":' .. k .. ',"estimated_units":' .. (arg_txt(argv[at + 2]) or m_fmt(it.est_units)) ..
      ',"estimated_cost":' .. (arg_txt(argv[at + 3]) or m_fmt(it.est_cost)) .. ',"actual_units":' .. au ..
      ',"actual_cost":' .. ac .. '}'
    costs[i] = c
    use_parts[i] = '{"billable_metric_key":' .. k .. ',"units":' .. au .. ',"cost":' .. ac .. '}'
  end
  return cost, res_parts, use_parts, costs
end
