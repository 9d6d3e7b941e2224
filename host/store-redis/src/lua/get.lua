local id = ARGV[5]
if redis.call('EXISTS', runkey(id)) == 0 then return { 'not_found' } end
local ak, sk = P .. 'att:' .. id, P .. 'stepseq:' .. id
local steps = redis.call('LRANGE', sk, 0, tonumber(ARGV[6]) - 1)
local sizes = {}
for i, e in ipairs(steps) do
  sizes[i] = redis.call('HSTRLEN', P .. 'steps:' .. id, string.match(e, '^[^|]*|[^|]*|(.*)$'))
end
-- The latest ARGV[7] executions, a running one from the hash (open_execution).
local open, want = open_execution(id), tonumber(ARGV[7])
local total, atts = redis.call('LLEN', ak), {}
if open[2] then
  total = total + 1
  want = want - 1
end
if want > 0 then atts = redis.call('LRANGE', ak, -want, -1) end
if open[2] then
  atts[#atts + 1] = (open[1] or '0') .. '|' .. open[2] .. '|' .. cjson.encode(open[3] or '')
end
return { 'ok', run_fields(id), total, atts, redis.call('LLEN', sk), steps, sizes }
