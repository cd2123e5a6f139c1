-- idempotency.lua owns what an op key remembers and how a retry is
-- answered from it (replay), so every money script replays alike.

-- OP_RECORD_CONSUME ('c') opens the compact op record of a consume; a
-- stored Mutation JSON (other scripts, and every op key a rebuild writes)
-- opens with '{'. OP_RH_LEN is how much of the request hash it keeps: 128
-- bits tell a retry from another request as well as the whole hash.
local OP_RECORD_CONSUME = 99
local OP_RH_LEN = 32

-- DOOR is the fused door's state and answers (door_fused.lua), one local
-- of the chunk (prelude.go: Lua's 200): DOOR.record is the door's
-- tenant-scope record key while a body runs under a door that left its
-- check to replay (door_run), else nil, and replay takes it; DOOR.held is
-- replay's answer when that record is held, which the door reads as
-- stale; DOOR.stale is the door's "stale" reply; DOOR.retried names the
-- refusals of a body that ask to be run again (no record written).
local DOOR = {record = nil, held = {err = 'DOORHELD the idempotency key has a record'},
  stale = {'door', 'stale', -2, 0, 0, 0}, retried = {NOSTATE = true, MAYBESEEN = true, STALE = true}}

-- DOOR.refused is door_run's reply to a body's refusal err: "retry" for
-- one that asks to be run again (no record written), else "err" with the
-- claim stored as the record; stale when the record, not read yet
-- (unchecked: the body refused before its replay), is held.
function DOOR.refused(err, record_key, running, running_ms, rate, unchecked)
  local what = 'retry'
  if not DOOR.retried[string.match(err, '^%u+') or ''] then
    if unchecked and redis.call('EXISTS', record_key) == 1 then return DOOR.stale end
    redis.call('SET', record_key, running, 'PX', running_ms)
    what = 'err'
  end
  return {'door', what, rate[1], rate[2], rate[3], rate[4], err}
end

-- op_record_consume is what a consume's op key remembers (lua/oprecord.go
-- decodes it): "c" request hash prefix "\n" then, joined by "|", op id, at
-- (ms), index of the consumption entry, units, cost, charged, overage,
-- balance, reserved, pending and the metric (never holds "|"). That is every
-- number the consume answer is built from, in about a fifth of the bytes
-- of the Mutation JSON.
-- Its arguments come formatted (mutation_json left the account figures in
-- m), so nothing is formatted twice.
local function op_record_consume(m, idx, metric, units, cost, charged, overage)
  return 'c' .. string.sub(m.rh, 1, OP_RH_LEN) .. '\n' .. m.op .. '|' .. m.at_s .. '|' .. idx .. '|' ..
    units .. '|' .. cost .. '|' .. charged .. '|' .. overage .. '|' .. m.bal_s .. '|' .. m.rs_s .. '|' ..
    m.pend_s .. '|' .. metric
end

-- replay answers a retried idempotency key: nil when op_key is absent or
-- unused, else the reply to return (the stored Mutation, or MISMATCH when it
-- was produced by another request). With seen (seen_keys), an absent op key
-- that the seen filter may know answers MAYBESEEN.
local function replay(op_key, rh, seen)
  -- Under a fused door (door_fused.lua) the key's tenant-scope record is
  -- read here too, with the op key: a record held (another request's
  -- claim, or this request's answer) makes the door stale before the
  -- body wrote anything, as the door's own EXISTS did a redis.call before.
  local rec = DOOR.record
  DOOR.record = nil
  if not op_key then
    if rec and redis.call('EXISTS', rec) == 1 then return DOOR.held end
    return nil
  end
  local prev, seeded, held = nil, nil, nil
  if seen then
    -- The op key and the partition's seeded mark (seen_mark, a string
    -- under the same hash tag) in one MGET: a redis.call less on every
    -- call whose key is new.
    local v = rec and redis.call('MGET', op_key, seen_mark(seen), rec) or redis.call('MGET', op_key, seen_mark(seen))
    prev, seeded, held = v[1], v[2], v[3]
  elseif rec then
    local v = redis.call('MGET', op_key, rec)
    prev, held = v[1], v[2]
  else
    prev = redis.call('GET', op_key)
  end
  if held then return DOOR.held end
  if not prev then
    if seen and seen_maybe(seen, op_key, seeded) then
      return redis.error_reply('MAYBESEEN the idempotency key may have been applied before')
    end
    return nil
  end
  if string.byte(prev, 1) == OP_RECORD_CONSUME then
    -- A compact consume record (op_record_consume): the request hash
    -- prefix runs up to the first newline.
    local nl = string.find(prev, '\n', 1, true)
    if not nl or string.sub(prev, 2, nl - 1) ~= string.sub(rh, 1, OP_RH_LEN) then
      return redis.error_reply('MISMATCH idempotency key used with another request')
    end
    return {'replay', prev}
  end
  local ok, m = pcall(cjson.decode, prev)
  if ok and type(m) == 'table' and m.rh ~= rh then
    return redis.error_reply('MISMATCH idempotency key used with another request')
  end
  return {'replay', prev}
end

-- usage_claim_one is one usage event id's claim ('c') or look ('l') of
-- claim key k for customer c (16 bytes), for usage_claim.lua: keys are its
-- KEYS, the id's usage filter keys[from..to] (the seeded mark, then the
-- period hashes; none when from > to). The claim and the filter's mark
-- share the slot's hash tag, so one MGET reads both: a redis.call less for
-- every new id. Reply as usage_claim.lua's, per id.
local function usage_claim_one(keys, k, o, c, from, to, ttl)
  local got = from <= to and redis.call('MGET', k, keys[from]) or {redis.call('GET', k)}
  local v = got[1]
  if not v then
    if o == 'c' then redis.call('SET', k, c .. '1', 'PX', ttl) end
    if from <= to and not seen_maybe({keys, from, to}, k, got[2]) then return 0 end
    return 2
  end
  local holder, state = string.sub(v, 1, 16), string.sub(v, 17)
  if o == 'l' or holder ~= c then return holder end
  if state ~= 'f' then redis.call('SET', k, c .. (tonumber(state) + 1), 'KEEPTTL') end
  return 1
end
