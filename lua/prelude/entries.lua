-- entries.lua owns the ledger entries and usage members of a Mutation,
-- so every money script writes the debit of a charge the same way.

-- entry_json is one engine.MutationEntry; reason and meta are JSON text or ''.
local function entry_json(role, delta, typ, src, block_id, reason, meta)
  local s = '{"role":"' .. role .. '","delta":' .. m_fmt(delta) .. ',"type":' .. q(typ) ..
    ',"source":' .. src_json(src) .. ',"block":' .. q(block_id)
  if reason ~= '' then s = s .. ',"reason":' .. reason end
  if meta ~= '' then s = s .. ',"meta":' .. meta end
  return s .. '}'
end

-- entry_obj is one engine.MutationEntry from the table e: role, delta
-- (money, or delta_s: its text) and type, and optionally src and block (null when absent), metric,
-- units (money), ref, overage (money), reason, meta (JSON text or '') and
-- open.
local function entry_obj(e)
  -- Each optional member is '' when absent, so the entry is one
  -- concatenation (each s = s .. x copied the entry so far).
  local metric, units, ref, overage, reason, meta, draws = '', '', '', '', '', '', ''
  if e.metric_j then metric = ',"metric":' .. e.metric_j elseif e.metric then metric = ',"metric":' .. j_str(e.metric) end
  if e.units_s then units = ',"units":' .. e.units_s elseif e.units then units = ',"units":' .. m_fmt(e.units) end
  if e.ref then ref = ',"ref":"' .. e.ref .. '"' end
  if e.overage then overage = ',"overage":' .. m_fmt(e.overage) end
  if e.reason and e.reason ~= '' then reason = ',"reason":' .. e.reason end
  if e.meta and e.meta ~= '' and not e.open then meta = ',"meta":' .. e.meta end
  if e.draws then
    local d = {}
    for i, x in ipairs(e.draws) do d[i] = '{"b":"' .. x.b.id .. '","d":' .. m_fmt(x.take) .. '}' end
    draws = ',"draws":[' .. table.concat(d, ',') .. ']'
  end
  local block = 'null'
  if e.block then block = '"' .. e.block .. '"' end
  -- open: the last entry of a Mutation, left open for mutation_json to
  -- splice its metadata (m.open_meta) into its one concatenation.
  return '{"role":"' .. e.role .. '","delta":' .. (e.delta_s or m_fmt(e.delta)) .. ',"type":"' .. e.type ..
    '","source":' .. (e.src and src_json(e.src) or 'null') .. ',"block":' .. block .. metric .. units .. ref ..
    overage .. reason .. meta .. draws .. (e.open and '' or '}')
end

-- debit_entry fills the consumption entry e (an entry_obj table) from the
-- draws of one drain: ONE ledger entry per charge (docs/spec/interface.md: a consume,
-- a commit and a usage event write one debit). Its delta is minus the
-- total drawn; it names the block and its source when one block paid, and
-- lists what each block paid (engine.EntryDraw) when several did.
local function debit_entry(e, draws)
  local total = MONEY_ZERO
  for _, d in ipairs(draws) do total = m_add(total, d.take) end
  e.delta = m_neg(total)
  if #draws == 1 then
    e.src, e.block = draws[1].b.src, draws[1].b.id
  elseif #draws > 1 then
    e.draws = draws
  end
  return e
end

-- usage_json_s is an engine.MutationUsage from its members already
-- formatted (the metric as JSON text, money in decimal), so a script that
-- also writes them elsewhere formats each once; res_id is nil outside a
-- commit.
local function usage_json_s(metric_j, units, cost, charged, overage, refused, res_id)
  local s = '{"metric":' .. metric_j .. ',"units":' .. units .. ',"cost":' .. cost ..
    ',"charged":' .. charged .. ',"overage":' .. overage
  if refused then s = s .. ',"refused":true' end
  if res_id then s = s .. ',"reservation":' .. q(res_id) end
  return s .. '}'
end

-- usage_json is an engine.MutationUsage; res_id is nil outside a commit.
local function usage_json(metric, units, cost, charged, overage, refused, res_id)
  return usage_json_s(j_str(metric), m_fmt(units), m_fmt(cost), m_fmt(charged), m_fmt(overage), refused, res_id)
end
