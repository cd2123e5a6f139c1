-- seen_seed.lua adds to the seen filter the op keys of operations Postgres
-- holds (lua/seen.go reads them), and, on the last page, marks the
-- partition seeded: until then every money call of the partition whose op
-- key is absent asks Postgres (prelude/seen.lua seen_maybe).
--
-- KEYS[1]   the partition's seeded mark {prefix:pNN}:seen:from
-- KEYS[2]   the partition's filter hash of this period
--           {prefix:pNN}:seen:p<period>
-- ARGV[1]   the hash's TTL in ms
-- ARGV[2]   "" or, on the last page, the instant the seeding read from
--           (Unix ms), stored as the mark's value
-- ARGV[3..] op key names (hashed, never read or written)
local mark, wk = KEYS[1], KEYS[2]
for i = 3, #ARGV do seen_put(wk, ARGV[i]) end
if #ARGV > 2 then redis.call('PEXPIRE', wk, ARGV[1]) end
if ARGV[2] ~= '' then redis.call('SET', mark, ARGV[2]) end
return #ARGV - 2
