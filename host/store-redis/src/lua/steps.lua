local id = ARGV[5]
if rcall('EXISTS', runkey(id)) == 0 then return { 'not_found' } end
local steps = step_order(id, tonumber(ARGV[6]), tonumber(ARGV[7]))
return { 'ok', steps, step_sizes(id, steps) }
