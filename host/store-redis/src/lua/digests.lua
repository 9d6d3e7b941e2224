-- The component digests runs and functions refer to (`rdig`: `|sv`, `digest|sv` or
-- `digest` → runs pinning it, built once from the runs when missing; a version that
-- names its component has it in its blob, `digest\nsettings`), for collect_components.
-- Settings versions (`sets`) nobody refers to any more are deleted here, given back to
-- the tenant.
if rcall('HGET', KMETA, 'rdig') ~= '1' then
  rcall('DEL', KRDIG)
  for _, k in ipairs(run_indexes()) do
    for _, id in ipairs(rcall('ZRANGE', k, 0, -1)) do
      local r = rcall('HMGET', runkey(id), 'digest', 'sv')
      if r[1] or r[2] then rcall('HINCRBY', KRDIG, pin(r[1], r[2]), 1) end
    end
  end
  rcall('HSET', KMETA, 'rdig', '1')
end
local out, keep = {}, {}
for _, k in ipairs(rcall('HKEYS', KRDIG)) do
  local d, sv = string.match(k, '^([^|]*)|?(.*)$')
  if d == '' then d = version_digest(rcall('HGET', KSETS, sv) or '') end
  if d then out[#out + 1] = d end
  if sv ~= '' then keep[sv] = true end
end
for _, name in ipairs(rcall('SMEMBERS', P .. 'fns')) do
  local f = rcall('HMGET', P .. 'fn:' .. name, 'digest', 'sv')
  if f[1] then out[#out + 1] = f[1] end
  if f[2] then keep[f[2]] = true end
end
for _, sv in ipairs(rcall('HKEYS', KSETS)) do
  if not keep[sv] then
    charge(nil, -set_cost(rcall('HSTRLEN', KSETS, sv)))
    rcall('HDEL', KSETS, sv)
  end
end
return { 'ok', out }
