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
