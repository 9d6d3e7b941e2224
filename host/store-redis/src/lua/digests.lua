if redis.call('HGET', P .. 'meta', 'rdig') ~= '1' then
  redis.call('DEL', P .. 'rdig')
  for _, id in ipairs(redis.call('ZRANGE', P .. 'all', 0, -1)) do
    local d = redis.call('HGET', runkey(id), 'digest')
    if d then redis.call('HINCRBY', P .. 'rdig', d, 1) end
  end
  redis.call('HSET', P .. 'meta', 'rdig', '1')
end
local out = redis.call('HKEYS', P .. 'rdig')
for _, name in ipairs(redis.call('SMEMBERS', P .. 'fns')) do
  local d = redis.call('HGET', P .. 'fn:' .. name, 'digest')
  if d then out[#out + 1] = d end
end
return { 'ok', out }
