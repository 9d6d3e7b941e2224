local id = ARGV[5]
if rcall('EXISTS', runkey(id)) == 0 then return { 'not_found' } end
local from = tonumber(ARGV[6])
local steps = rcall('LRANGE', P .. 'stepseq:' .. id, from, from + tonumber(ARGV[7]) - 1)
local sizes = {}
for i, e in ipairs(steps) do
  sizes[i] = rcall('HSTRLEN', P .. 'steps:' .. id, string.match(e, '^[^|]*|[^|]*|(.*)$'))
end
return { 'ok', steps, sizes }
