-- mutation.lua owns the Mutation JSON of a change and appending it to the
-- customer's outbox partition with its op key, so no acknowledged change
-- can miss Postgres.

-- mutation_json builds the engine.Mutation of a change (account figures at
-- now, after it); m holds op, kind, tenant, customer, env, idem (JSON text),
-- rh, now and optionally ctx (engine.MutationContext JSON text from Go,
-- spliced as is), eb (effective balance before the change, money),
-- open_meta (the metadata of the last entry, which entry_obj left open),
-- extra (more members: ',"usage":{...}') and res (a reservation, written
-- as member "res" with its metadata, in the same concatenation: a long
-- string is copied once); then the account a, entries and changed blocks.
local function mutation_json(m, a, entries, changed)
  -- acct_bal's figures without the effective balance it would also compute.
  local bal, pend = a.bal, a.pend
  if not bal then bal, pend = balances(a.blocks, a.rs, m.now) end
  local r = m.res
  -- Kept formatted for an op record (op_record_consume).
  local rs = a.rs
  m.bal_s, m.pend_s, m.at_s = (bal == a.bal_k and a.bal_s) or m_fmt(bal), m_fmt(pend), now_fmt(m.now)
  -- The balance counts the debt of the credit line (acct_bal), which the
  -- account section also names while there is one.
  local debt_s = ''
  if m_pos(a.d) then
    m.bal_s, debt_s = m_fmt(m_sub(bal, a.d)), ',"debt":' .. m_fmt(a.d)
  end
  m.rs_s = m_fmt(rs)
  -- One changed block (a grant's, a small drain's) is spliced with its
  -- metadata into the Mutation; several are joined first.
  local bs, bmeta, btail = '', nil, ''
  if #changed == 1 then
    bs, bmeta, btail = block_json(changed[1])
  elseif #changed > 1 then
    local bj = {}
    for i, b in ipairs(changed) do
      local head, meta, tail = block_json(b)
      bj[i] = meta and (head .. ',"meta":' .. meta .. tail) or (head .. tail)
    end
    bs = table.concat(bj, ',')
  end
  -- A single entry is used as is: table.concat would hash it again.
  local es = entries[1] or ''
  if #entries > 1 then es = table.concat(entries, ',') end
  -- Quotes are written inline (q would make a string per member).
  return '{"op":"' .. m.op .. '","kind":"' .. m.kind .. '","tenant":"' .. m.tenant ..
    '","customer":"' .. m.customer .. '","env":"' .. m.env .. '","idem":' .. m.idem ..
    ',"rh":"' .. m.rh .. '","at":' .. m.at_s ..
    ',"account":{"id":"' .. a.id .. '","version":' .. ((a.v_n == a.v and a.v_s) or i_fmt(a.v)) ..
    ',"balance":' .. m.bal_s ..
    ',"reserved":' .. m.rs_s .. ',"pending":' .. m.pend_s .. ',"lifetime_earned":' .. le_fmt(a) .. debt_s ..
    '},"entries":[' .. es .. ((m.open_meta and m.open_meta ~= '') and ',"meta":' or '') ..
    (m.open_meta or '') .. (m.open_meta and '}' or '') .. '],"blocks":[' .. bs .. (bmeta and ',"meta":' or '') ..
    (bmeta or '') .. btail .. ']' ..
    ((m.ctx and m.ctx ~= '') and (',"ctx":' .. m.ctx) or '') ..
    (m.eb and (',"eb":' .. m_fmt(m.eb)) or '') .. (m.extra or '') ..
    (r and (',"res":' .. res_json_head(r)) or '') .. ((r and r.meta ~= '') and ',"meta":' or '') ..
    (r and r.meta or '') .. (r and '}' or '') .. '}'
end

-- refuse appends the refusal record of a customer refused for credit, for
-- credit.exhausted (docs/spec/addendum.md §8): m without an idempotency key (so Postgres
-- never takes it for an applied operation), with no entries, and with
-- usage, its usage section marked refused. The account is left untouched.
local function refuse(outbox, m, a, usage)
  m.idem, m.rh, m.extra = '""', '', ',"usage":' .. usage
  redis.call('XADD', outbox, '*', 'm', mutation_json(m, a, {}, {}))
end

-- publish appends the Mutation to the partition outbox and, under an
-- idempotency key, remembers record (the Mutation itself when nil) for
-- ttl_ms so a retry replays it.
local function publish(outbox, op_key, ttl_ms, json, record)
  redis.call('XADD', outbox, '*', 'm', json)
  if op_key then redis.call('SET', op_key, record or json, 'PX', ttl_ms) end
end
