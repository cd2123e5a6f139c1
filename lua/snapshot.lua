-- snapshot.lua reads one customer's account fields and blocks, unchanged;
-- Go filters the blocks live at its now and derives the balances, with the
-- same rules (engine.ComputeBalances) the money scripts follow.
--
-- KEYS[1]  account hash {prefix:pNN}:a:<customer>
--
-- Reply: JSON {"id":..,"version":..,"reserved":..,"lifetime_earned":..,
-- "updated":<ms>,"blocks":[engine.MutationBlock...]}; error NOSTATE.
local account_key = KEYS[1]

local a = acct_read(account_key)
if not a then return redis.error_reply('NOSTATE no credit state for the customer') end

local bj = {}
for i, b in ipairs(a.blocks) do bj[i] = block_json(b) end
return '{"id":' .. j_str(a.id) .. ',"version":' .. i_fmt(a.v) .. ',"reserved":' .. m_fmt(a.rs) ..
  ',"lifetime_earned":' .. m_fmt(a.le) .. ',"updated":' .. i_fmt(a.ua) ..
  ',"blocks":[' .. table.concat(bj, ',') .. ']}'
