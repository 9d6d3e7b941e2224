-- A run's webhook deliveries, in the order added: ARGV[5] the run id. Answers 'ok' and
-- each delivery's id and fields (deliveries.lua's FIELDS).
local out = {}
for _, id in ipairs(rcall('LRANGE', P .. 'dlvrun:' .. ARGV[5], 0, -1)) do
  local d = rcall('HMGET', P .. 'dlv:' .. id, 'run', 'url', 'event', 'payload', 'status',
    'tries', 'next_at', 'token', 'last_error', 'created_at', 'updated_at')
  if d[1] then
    table.insert(d, 1, id)
    out[#out + 1] = d
  end
end
return { 'ok', out }
