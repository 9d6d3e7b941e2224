local LIMIT = tonumber(ARGV[7])
local n = 0
local function delete(id)
  local rk = runkey(id)
  local r = rcall('HMGET', rk, 'status', 'function', 'parent', 'idempotency_key', 'sbytes',
    'lbytes', 'digest', 'sv')
  charge(nil, -(tonumber(r[5] or '0') + tonumber(r[6] or '0')))
  if r[7] or r[8] then
    local k = pin(r[7], r[8])
    if rcall('HINCRBY', KRDIG, k, '-1') <= 0 then rcall('HDEL', KRDIG, k) end
  end
  rcall('ZREM', KENDOK, id)
  rcall('ZREM', KENDBAD, id)
  if r[1] then rcall('ZREM', stkey(r[1]), id) end
  if r[2] then rcall('ZREM', byfnkey(r[2]), id) end
  if r[3] then rcall('ZREM', P .. 'kids:' .. r[3], id) end
  if r[2] and r[4] then
    local ik = P .. 'idem:' .. r[2]
    local v = rcall('HGET', ik, r[4])
    if v and string.sub(v, -#id) == id then rcall('HDEL', ik, r[4]) end
  end
  rcall('DEL', rk, P .. 'steps:' .. id, P .. 'stepseq:' .. id, P .. 'att:' .. id,
    P .. 'logs:' .. id, P .. 'rw:' .. id, inkey(id))
  -- Its webhook deliveries.
  local dk = P .. 'dlvrun:' .. id
  for _, d in ipairs(rcall('LRANGE', dk, 0, -1)) do
    rcall('DEL', P .. 'dlv:' .. d)
    rcall('ZREM', P .. 'dlvq', d)
  end
  rcall('DEL', dk)
end
-- Indexes an older wasq kept: of all runs, `all`, and of running runs, `st:running`
-- (they are indexed by their lease alone now). A tenant's first purge since drops them
-- (UNLINK frees them off Redis's main thread).
local dropped = rcall('HMGET', KMETA, 'noall', 'norun')
if dropped[1] ~= '1' then
  rcall('UNLINK', P .. 'all')
  rcall('HSET', KMETA, 'noall', '1')
end
if dropped[2] ~= '1' then
  rcall('UNLINK', stkey('running'))
  rcall('HSET', KMETA, 'norun', '1')
end
for _, pair in ipairs({ { 'ended:ok', ARGV[5] }, { 'ended:bad', ARGV[6] } }) do
  if n < LIMIT then
    local ids = rcall('ZRANGEBYSCORE', P .. pair[1], '-inf', '(' .. pair[2], 'LIMIT', 0, LIMIT - n)
    for _, id in ipairs(ids) do
      delete(id)
      n = n + 1
    end
  end
end
-- Event ids are only remembered for their dedup window.
forget_events(LIMIT)
return { 'ok', n }
