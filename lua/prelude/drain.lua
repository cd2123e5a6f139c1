-- drain.lua owns taking money out of blocks: expiring what is due and
-- drawing a charge in spend order, on both the fast and the slow path,
-- so every charge is drawn the same way.

-- expire_due zeroes every block with credit whose expires_at is at or before
-- now, appending its expiry entry and the block to entries and changed.
local function expire_due(a, now, entries, changed)
  -- On the fast path only the blocks a refresh found due (acct_read).
  if a.fast then
    if a.due and #a.due > 0 then
      table.sort(a.due, spends_before)
      for _, b in ipairs(a.due) do
        entries[#entries + 1] = entry_json('expiry', m_neg(b.rem), 'expiry', b.src, b.id, '', '')
        b.rem = MONEY_ZERO
        changed[#changed + 1] = b
      end
    end
    a.due = nil
    return
  end
  local due = {}
  for _, b in ipairs(a.blocks) do
    if b.expires and b.expires <= now and m_pos(b.rem) then due[#due + 1] = b end
  end
  table.sort(due, spends_before)
  for _, b in ipairs(due) do
    entries[#entries + 1] = entry_json('expiry', m_neg(b.rem), 'expiry', b.src, b.id, '', '')
    b.rem = MONEY_ZERO
    changed[#changed + 1] = b
  end
end

-- draw takes what it can of left from block b, records the draw and the
-- changed block, and returns what is left: both of drain's walks draw
-- through it, so they cannot differ in how a block is charged.
local function draw(b, left, draws, changed)
  local take = m_min(b.rem, left)
  b.rem = m_sub(b.rem, take)
  draws[#draws + 1] = {b = b, take = take}
  changed[#changed + 1] = b
  return m_sub(left, take)
end

-- drain takes amount from a's started live blocks in spend order
-- (engine.SpendOrder), appending each block touched to changed; it returns
-- the draws {b = block, take = money}. The caller has checked that the
-- blocks hold amount (with metric: the blocks that apply to it, scope_free).
-- Its helper is a local of the do block below, not of the chunk: a money
-- script linked with the prelude (link.go) sits near Lua's 200 locals.
local drain
do
  -- drain_slow is drain on the slow path, every block of a decoded.
  local function drain_slow(a, now, amount, changed, metric)
    local spendable = {}
    for _, b in ipairs(a.blocks) do
      -- With metric, only the blocks that apply to it (the fast path tells
      -- them by their value on a scoped hash, a.sc_fast).
      if live(b, now) and b.starts <= now and (not metric or applies(b, metric)) then spendable[#spendable + 1] = b end
    end
    -- The next block in spend order, picked by a scan rather than a sort of
    -- them all: a charge usually draws from one or two blocks, so this costs
    -- one pass per block drawn instead of n log n comparisons (invariant 13).
    -- After four picks the rest is sorted once (a drain of many blocks).
    local draws, left, sorted, at = {}, amount, false, 0
    while m_pos(left) do
      local b
      if sorted then
        at = at + 1
        b = spendable[at]
      elseif #draws == 4 then
        table.sort(spendable, spends_before)
        sorted, at = true, 1
        b = spendable[1]
      elseif #spendable > 0 then
        local i0 = 1
        for i = 2, #spendable do
          if spends_before(spendable[i], spendable[i0]) then i0 = i end
        end
        b = table.remove(spendable, i0)
      end
      if not b then break end
      left = draw(b, left, draws, changed)
    end
    return draws
  end

  function drain(a, now, amount, changed, metric)
    if not a.fast then return drain_slow(a, now, amount, changed, metric) end
    -- Walk the spend-order index, reading only the blocks taken from (in
    -- HMGETs of 1, 4, 16 ... entries: one block pays most charges, and
    -- each entry parsed costs about as much as an HMGET), skipping those
    -- not started yet.
    if not a.idx then a.idx = redis.call('HGET', a.key, 'o') or '' end
    local draws, left, pos, want = {}, amount, 1, 1
    while m_pos(left) do
      local ids, names, texts = {}, {}, {}
      while #ids < want do
        local s, fin, id, _, exp, _, st = string.find(a.idx, IDX_PAT, pos)
        if not s then break end
        pos = fin + 2
        local x, y = tonumber(exp), tonumber(st)
        -- Not started, or due (a refresh's expire_due zeroed it already).
        if y <= now and (x == nil or x > now) then
          ids[#ids + 1] = id
          names[#names + 1] = 'b:' .. id
          texts[#ids] = {exp, x, st, y}
        end
      end
      if #ids == 0 then break end
      local vals = redis.call('HMGET', a.key, unpack(names))
      for i, id in ipairs(ids) do
        if not m_pos(left) then break end
        if not vals[i] then error('the spend-order index names block ' .. id .. ', which the hash lacks') end
        -- A scoped hash's fast path (scope_fast): only blocks that apply,
        -- told from the value's scope field before decoding it.
        local raw, ok = vals[i], true
        if metric and a.sc_fast then
          local at = string.find(raw, '|@', 1, true)
          ok = not at or string.find(',' .. string.sub(raw, at + 2) .. ',', ',' .. metric .. ',', 1, true) ~= nil
        end
        if ok then
          local b = block_dec(id, raw)
          b.rem0 = b.rem
          -- The index's decimal instants, for block_json (no sprintf).
          b.ix = texts[i]
          left = draw(b, left, draws, changed)
        end
      end
      want = want * 4
    end
    return draws
  end
end
