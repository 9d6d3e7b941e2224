-- Redis's and Lua's functions as locals of the library (upvalues of its functions): a
-- global is a lookup in the globals table at every use (`redis.call` two: `redis`, then
-- `call`), an upvalue an index. A library's top level, run when it loads, sees none of
-- them, so the first call's `enter` fills them in (`fill_builtins`) from `builtins`, which
-- sees the globals (it comes before these names are declared). An EVAL script (the
-- Cluster's hint) fills them in at its top. (Only the ones used per run: more upvalues
-- measured no better.)
local function builtins() return redis.call, tonumber, ipairs, pairs, unpack, string.format end
local rcall, tonumber, ipairs, pairs, unpack, sformat
local function fill_builtins() rcall, tonumber, ipairs, pairs, unpack, sformat = builtins() end
