-- library_gc.lua: the Lua collector's pace for the node's Functions state,
-- set by the library's first call (engine-free; lua/library.go frames it).
--
-- Redis steps Lua's incremental collector itself every 50 calls, so a
-- collection cycle never waits for the heap to grow: it is always running,
-- and each KB a script allocates buys the collector stepmul % of a KB of
-- marking and sweeping. A cycle walks the whole live heap, and most of the
-- library's is its caches of decoded values (blocks, budgets, kept lists,
-- seen-filter fields: a few MB), which the request's own work has pushed
-- out of the CPU caches: the walk is cache misses, a far larger share of a
-- consume's time than of its instructions (docs/decisions.md "The Lua
-- collector's pace"). At GC_STEPMUL 50 a cycle runs about a quarter as
-- often as at Lua's default 200, for a heap about 1.5 times the live set
-- instead of about 1.25 times.
--
-- collectgarbage is not reachable while FUNCTION LOAD runs the library's
-- top level, only inside a call: hence the flag, checked by every
-- registered function (one upvalue test a call). The setting is the Lua
-- state's, so it holds for every library of the node, and a FUNCTION FLUSH
-- or a restart, which make a new state, also reload this library with its
-- flag clear.
local GC_STEPMUL = 50
local gc_paced = false

local function gc_pace()
  gc_paced = true
  collectgarbage('setstepmul', GC_STEPMUL)
end
