local id = ARGV[5]
if redis.call('EXISTS', runkey(id)) == 0 then return { 'not_found' } end
local from = tonumber(ARGV[6])
local steps = redis.call('LRANGE', P .. 'stepseq:' .. id, from, from + tonumber(ARGV[7]) - 1)
local sizes = {}
for i, e in ipairs(steps) do
  sizes[i] = redis.call('HSTRLEN', P .. 'steps:' .. id, string.match(e, '^[^|]*|[^|]*|(.*)$'))
end
return { 'ok', steps, sizes }
