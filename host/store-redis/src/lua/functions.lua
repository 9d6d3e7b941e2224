local out = {}
for _, name in ipairs(redis.call('SMEMBERS', P .. 'fns')) do
  local h = redis.call('HGETALL', P .. 'fn:' .. name)
  if #h > 0 then out[#out + 1] = h end
end
return { 'ok', out }
