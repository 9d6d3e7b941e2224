local id = ARGV[5]
if rcall('EXISTS', runkey(id)) == 0 then return { 'not_found' } end
local steps = step_order(id, tonumber(ARGV[6]), tonumber(ARGV[7]))
local sizes = {}
for i, e in ipairs(steps) do
  sizes[i] = rcall('HSTRLEN', P .. 'steps:' .. id, string.match(e, '^[^|]*|[^|]*|(.*)$'))
end
return { 'ok', steps, sizes }
