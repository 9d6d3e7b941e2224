local id = ARGV[5]
if redis.call('EXISTS', runkey(id)) == 0 then return { 'not_found' } end
local ak, sk = P .. 'att:' .. id, P .. 'stepseq:' .. id
local steps = redis.call('LRANGE', sk, 0, tonumber(ARGV[6]) - 1)
local sizes = {}
for i, e in ipairs(steps) do
  sizes[i] = redis.call('HSTRLEN', P .. 'steps:' .. id, string.match(e, '^[^|]*|[^|]*|(.*)$'))
end
return { 'ok', run_fields(id), redis.call('LLEN', ak),
  redis.call('LRANGE', ak, -tonumber(ARGV[7]), -1), redis.call('LLEN', sk), steps, sizes }
