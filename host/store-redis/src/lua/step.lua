local id, field = ARGV[5], ARGV[6]
local output = rcall('HGET', P .. 'steps:' .. id, field)
if not output then return { 'not_found' } end
for _, e in ipairs(step_order(id, 0)) do
  if string.match(e, '^[^|]*|[^|]*|(.*)$') == field then return { 'ok', e, output } end
end
return { 'not_found' }
