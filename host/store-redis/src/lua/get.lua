local id = ARGV[5]
if rcall('EXISTS', runkey(id)) == 0 then return { 'not_found' } end
local ak, sk = P .. 'att:' .. id, P .. 'stepseq:' .. id
local steps, off = step_order(id, 0, tonumber(ARGV[6]))
local sizes = {}
for i, e in ipairs(steps) do
  sizes[i] = rcall('HSTRLEN', P .. 'steps:' .. id, string.match(e, '^[^|]*|[^|]*|(.*)$'))
end
return { 'ok', run_fields(id), rcall('LLEN', ak),
  rcall('LRANGE', ak, -tonumber(ARGV[7]), -1), rcall('LLEN', sk) + off, steps, sizes }
