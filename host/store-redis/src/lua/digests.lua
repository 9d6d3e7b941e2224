-- The component digests runs and functions refer to (`rdig`: `digest|sv` → runs pinning
-- it, built once from the runs when missing), for collect_components. Settings versions
-- (`sets`) nobody refers to any more are deleted here, given back to the tenant.
if redis.call('HGET', KMETA, 'rdig') ~= '1' then
  redis.call('DEL', KRDIG)
  for _, status in ipairs(STATUSES) do
    for _, id in ipairs(redis.call('ZRANGE', stkey(status), 0, -1)) do
      local r = redis.call('HMGET', runkey(id), 'digest', 'sv')
      if r[1] then redis.call('HINCRBY', KRDIG, pin(r[1], r[2]), 1) end
    end
  end
  redis.call('HSET', KMETA, 'rdig', '1')
end
local out, keep = {}, {}
for _, k in ipairs(redis.call('HKEYS', KRDIG)) do
  local d, sv = string.match(k, '^([^|]*)|?(.*)$')
  out[#out + 1] = d
  if sv ~= '' then keep[sv] = true end
end
for _, name in ipairs(redis.call('SMEMBERS', P .. 'fns')) do
  local f = redis.call('HMGET', P .. 'fn:' .. name, 'digest', 'sv')
  if f[1] then out[#out + 1] = f[1] end
  if f[2] then keep[f[2]] = true end
end
for _, sv in ipairs(redis.call('HKEYS', KSETS)) do
  if not keep[sv] then
    charge(nil, -set_cost(redis.call('HSTRLEN', KSETS, sv)))
    redis.call('HDEL', KSETS, sv)
  end
end
return { 'ok', out }
