-- account_commit.lua owns writing the account back: the changed blocks
-- and reservations and the layout v2 fields kept exact, in one HSET and at most
-- one HDEL.

-- le_fmt is a's lifetime earned as text: as read while unchanged (no
-- script but a grant moves it).
local function le_fmt(a)
  if a.le_k == a.le and a.le_s then return a.le_s end
  return m_fmt(a.le)
end

-- acct_commit writes the account fields, the changed blocks and the
-- changed reservations with their metadata, drops reservations finalized
-- long enough ago (commit_reservations) and keeps the summary, index and kept list
-- (layout.lua) exact at now. Each redis.call costs ~15,000 instructions,
-- so the writes go as one HSET and at most one HDEL. No expiry index is
-- kept in Redis: the sweep asks Postgres (engine.ExpiryIndex).
-- Its helpers are locals of the do block below, not of the chunk: a money
-- script linked with the prelude (link.go) sits near Lua's 200 locals.
local acct_commit
do
  -- commit_blocks adds the changed blocks to set and del (emptied ones are
  -- deleted with their metadata: Postgres keeps their history) and, on the
  -- fast path, moves the summary and the index with them. It returns
  -- whether the index moved, whether E, S or F must be recomputed (on the
  -- fast path at now they are the summary's: F <= now < min(E, S)), the
  -- count of blocks with credit that have a scope (field "sc", absent for
  -- none: a.sc_n as read, moved by each change) and whether it moved.
  local function commit_blocks(akey, a, changed, now, set, del)
    local idx_moved, bounds_moved = false, false
    local nsc, sc_moved = a.sc_n or 0, false
    -- Ids of blocks leaving the index, cut out together after the loop.
    local gone = {}
    for _, b in ipairs(changed) do
      if m_pos(b.rem) then
        set[#set + 1], set[#set + 2] = 'b:' .. b.id, block_enc(b)
        -- A new block's metadata (a block read from the hash has none in
        -- b.meta: it stays in its field).
        if b.meta ~= '' then set[#set + 1], set[#set + 2] = 'm:' .. b.id, b.meta end
      else
        del[#del + 1], del[#del + 2] = 'b:' .. b.id, 'm:' .. b.id
      end
      if a.fast and not a.idx then a.idx = redis.call('HGET', akey, 'o') or '' end
      if a.fast then
        -- Every block of the index is live and started or pending as the
        -- summary says (now is before E and S): only the change moves it.
        if b.fresh and not m_pos(b.rem) then
          -- A grant that went whole to the debt of the credit line: a block
          -- Postgres keeps, never in the hash.
        elseif b.fresh then
          if b.scope then nsc, sc_moved = nsc + 1, true end
          a.idx, idx_moved, a.nblocks = idx_insert(a.idx, b), true, a.nblocks + 1
          if live(b, now) then
            a.nlive, a.bal = a.nlive + 1, m_add(a.bal, b.rem)
            if not started(b, now) then a.pend = m_add(a.pend, b.rem) end
          end
          -- E, S and F with one more block: no index scan.
          if b.expires and (a.exp_min == nil or b.expires < a.exp_min) then a.exp_min = b.expires end
          if b.starts > now then
            if a.start_min == nil or b.starts < a.start_min then a.start_min = b.starts end
          elseif a.start_max == nil or b.starts > a.start_max then
            a.start_max = b.starts
          end
        elseif b.gone then
          -- Due: already out of the figures (acct_read's refresh).
          gone[b.id], a.nblocks, idx_moved = true, a.nblocks - 1, true
          bounds_moved = true
          if b.scope then nsc, sc_moved = nsc - 1, true end
        else
          a.bal = m_add(a.bal, m_sub(b.rem, b.rem0))
          if not m_pos(b.rem) then
            gone[b.id], a.nlive, a.nblocks, idx_moved = true, a.nlive - 1, a.nblocks - 1, true
            if b.scope then nsc, sc_moved = nsc - 1, true end
            -- E, S and F move only when the emptied block held one of them.
            if b.expires == a.exp_min or b.starts == a.start_min or b.starts == a.start_max then bounds_moved = true end
          end
        end
      end
    end
    if next(gone) then a.idx = idx_remove(a.idx, gone) end
    return idx_moved, bounds_moved, nsc, sc_moved
  end

  -- summary_rebuild sets a's summary figures from every block (the slow
  -- path) and returns the blocks with credit, for the index, and how many
  -- of them have a scope.
  local function summary_rebuild(a, now)
    local bal, pend, n, e, st, f = MONEY_ZERO, MONEY_ZERO, 0, nil, nil, nil
    local keep, nsc = {}, 0
    for _, b in ipairs(a.blocks) do
      if m_pos(b.rem) then
        keep[#keep + 1] = b
        if b.scope then nsc = nsc + 1 end
        -- live and started with the remainder already tested: two calls
        -- and a money test fewer a block.
        if b.expires == nil or b.expires > now then
          n, bal = n + 1, m_add(bal, b.rem)
          if b.starts > now then pend = m_add(pend, b.rem) end
        end
        if b.expires and (e == nil or b.expires < e) then e = b.expires end
        if b.starts > now then
          if st == nil or b.starts < st then st = b.starts end
        elseif f == nil or b.starts > f then
          f = b.starts
        end
      end
    end
    a.bal, a.pend, a.nlive, a.nblocks, a.exp_min, a.start_min, a.start_max = bal, pend, n, #keep, e, st, f
    return keep, nsc
  end

  -- commit_reservations adds the changed reservations with their metadata to set,
  -- and to del the reservations finalized more than RES_KEEP_MS ago (and
  -- the oldest past MAX_KEPT_RESERVATIONS), leaving a.kept the reservations kept. big:
  -- the account keeps the layout v2 fields. It returns whether the kept
  -- list moved.
  local function commit_reservations(a, now, set, del, big)
    for id in pairs(a.res_dirty) do
      set[#set + 1], set[#set + 2] = 'r:' .. id, a.res[id]
      if a.res_meta[id] and a.res_meta[id] ~= '' then set[#set + 1], set[#set + 2] = 'n:' .. id, a.res_meta[id] end
    end
    local kept, kept_moved = {}, a.kept_moved or not a.fast
    for _, k in ipairs(a.kept) do
      if k[2] + RES_KEEP_MS <= now then
        del[#del + 1], del[#del + 2] = 'r:' .. k[1], 'n:' .. k[1]
        kept_moved = true
      else
        kept[#kept + 1] = k
      end
    end
    -- Sorted for field "k", or to prune; a small account's kept reservations need
    -- no order (kept_before ties cost a byte loop).
    if (kept_moved and big) or #kept > MAX_KEPT_RESERVATIONS then
      table.sort(kept, kept_before)
      if #kept > MAX_KEPT_RESERVATIONS then
        kept_moved = true
        -- The oldest finalized reservations leave early, down to half the cap, so
        -- this runs once per MAX_KEPT_RESERVATIONS / 2 finalizations at most.
        local drop = #kept - MAX_KEPT_RESERVATIONS / 2
        for i = 1, drop do del[#del + 1], del[#del + 2] = 'r:' .. kept[i][1], 'n:' .. kept[i][1] end
        kept = {unpack(kept, drop + 1)}
      end
    end
    a.kept = kept
    return kept_moved
  end

  -- commit_layout adds the layout v2 fields that moved to set (an account
  -- of LAYOUT_MIN_ITEMS or more, big) or all three to del (a small account
  -- that had them); keep is summary_rebuild's blocks on the slow path, whose
  -- index is written whole.
  local function commit_layout(a, set, del, big, keep, idx_moved, kept_moved)
    if big then
      if keep then
        table.sort(keep, spends_before)
        local ents = {}
        for i, b in ipairs(keep) do ents[i] = idx_entry(b) end
        a.idx, idx_moved = table.concat(ents, ' '), true
      end
      if idx_moved then set[#set + 1], set[#set + 2] = 'o', a.idx end
      if kept_moved then
        local ks = {}
        for i, k in ipairs(a.kept) do ks[i] = k[3] or (k[1] .. ',' .. i_fmt(k[2])) end
        set[#set + 1], set[#set + 2] = 'k', table.concat(ks, ' ')
      end
      -- The balance's text is kept for mutation_json (a.bal_s while a.bal_k
      -- is a.bal).
      a.bal_s, a.bal_k = m_fmt(a.bal), a.bal
      local t, tail = a.s_tail, nil
      if t and t[2] == a.pend and t[3] == a.nlive and t[4] == a.active and t[5] == a.exp_min and
          t[6] == a.start_min and t[7] == a.start_max then
        tail = t[1]
      else
        tail = m_fmt(a.pend) .. '|' .. i_fmt(a.nlive) .. '|' .. i_fmt(a.active) .. '|' .. opt_fmt(a.exp_min) .. '|' ..
          opt_fmt(a.start_min) .. '|' .. opt_fmt(a.start_max)
      end
      set[#set + 1], set[#set + 2] = 's', a.bal_s .. '|' .. tail
    elseif a.fast or a.layout then
      -- A small account goes without them (a listpack hash stays one).
      del[#del + 1], del[#del + 2], del[#del + 3] = 's', 'o', 'k'
    end
  end

  function acct_commit(akey, a, changed, now)
    -- The version's text is kept for mutation_json (a.v_s while a.v_n is a.v).
    a.v_s, a.v_n = i_fmt(a.v), a.v
    -- Four more slots named (nil): a changed block and the summary come
    -- next, and an array grown past a power of two is copied.
    local set = {'id', a.id, 'v', a.v_s, 'le', le_fmt(a), 'ua', now_fmt(now), nil, nil, nil, nil}
    local del = {}
    -- The reserved total is kept only while it is not zero (a missing "rs"
    -- reads as zero): most accounts hold no reservation (issue 10).
    if m_cmp(a.rs, MONEY_ZERO) ~= 0 then
      set[#set + 1], set[#set + 2] = 'rs', m_fmt(a.rs)
    elseif a.rs_stored then
      del[#del + 1] = 'rs'
    end
    -- The debt of the credit line, likewise only while there is one.
    if m_pos(a.d) then
      set[#set + 1], set[#set + 2] = 'd', m_fmt(a.d)
    elseif a.d_stored then
      del[#del + 1] = 'd'
    end
    local idx_moved, bounds_moved, nsc, sc_moved = commit_blocks(akey, a, changed, now, set, del)
    local keep = nil
    if not a.fast then
      keep, nsc = summary_rebuild(a, now)
      sc_moved = true
    elseif bounds_moved or a.bounds_stale then
      a.exp_min, a.start_min, a.start_max = idx_bounds(a.idx, now)
    end
    local big = a.nblocks + a.active >= LAYOUT_MIN_ITEMS
    local kept_moved = commit_reservations(a, now, set, del, big)
    commit_layout(a, set, del, big, keep, idx_moved, kept_moved)
    if sc_moved and nsc > 0 then
      set[#set + 1], set[#set + 2] = 'sc', i_fmt(nsc)
    elseif sc_moved and (a.sc or a.sc_n) then
      del[#del + 1] = 'sc'
    end
    -- Fields a script asked to write with the account (budget counters:
    -- budget_count), in the same HSET.
    if a.also then
      for i = 1, #a.also do set[#set + 1] = a.also[i] end
    end
    redis.call('HSET', akey, unpack(set))
    if #del > 0 then redis.call('HDEL', akey, unpack(del)) end
  end
end
