local id = ARGV[5]
if rcall('EXISTS', runkey(id)) == 0 then return { 'not_found' } end
local ak = P .. 'att:' .. id
local steps, off = step_order(id, 0, tonumber(ARGV[6]))
return { 'ok', run_fields(id), rcall('LLEN', ak),
  rcall('LRANGE', ak, -tonumber(ARGV[7]), -1), rcall('LLEN', P .. 'stepseq:' .. id) + off,
  steps, step_sizes(id, steps) }
