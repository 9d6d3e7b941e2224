-- Webhook deliveries (wasq_core::notify): `dlv:<id>` hashes, the pending ones in `dlvq`
-- by due time, a run's ids in `dlvrun:<run>` in the order added. Answers 'ok' and the
-- tenant's earliest due time ('' when none is pending), which Rust copies into the global
-- `G dlv` (the tenants with deliveries to send).
-- ARGV[5]: 'add', n, then n × (id, run, url, event, payload);
--          'claim', limit, lease_ms: answers the claimed deliveries' fields too;
--          'try', id, token, tries before, then core's after_try: status, tries,
--          next_at, last_error ('' = none).
local op = ARGV[5]
local KDQ = P .. 'dlvq'
local FIELDS = { 'run', 'url', 'event', 'payload', 'status', 'tries', 'next_at', 'token',
  'last_error', 'created_at', 'updated_at' }
local out = {}
if op == 'add' then
  for j = 0, tonumber(ARGV[6]) - 1 do
    local o = 7 + j * 5
    local id, run = ARGV[o], ARGV[o + 1]
    local k = P .. 'dlv:' .. id
    if rcall('EXISTS', k) == 0 then
      rcall('HSET', k, 'run', run, 'url', ARGV[o + 2], 'event', ARGV[o + 3],
        'payload', ARGV[o + 4], 'status', 'pending', 'tries', '0', 'next_at', NOWS,
        'token', '0', 'created_at', NOWS, 'updated_at', NOWS)
      rcall('ZADD', KDQ, NOWS, id)
      rcall('RPUSH', P .. 'dlvrun:' .. run, id)
    end
  end
elseif op == 'claim' then
  local until_ = I(NOW + tonumber(ARGV[7]))
  local due = rcall('ZRANGEBYSCORE', KDQ, '-inf', NOWS, 'LIMIT', 0, tonumber(ARGV[6]))
  for _, id in ipairs(due) do
    local k = P .. 'dlv:' .. id
    rcall('HINCRBY', k, 'token', 1)
    rcall('HSET', k, 'next_at', until_)
    rcall('ZADD', KDQ, until_, id)
    local d = rcall('HMGET', k, unpack(FIELDS))
    table.insert(d, 1, id)
    out[#out + 1] = d
  end
elseif op == 'try' then
  local k = P .. 'dlv:' .. ARGV[6]
  local d = rcall('HMGET', k, 'token', 'status', 'tries')
  if d[1] == ARGV[7] and d[2] == 'pending' and d[3] == ARGV[8] then
    local status = ARGV[9]
    rcall('HSET', k, 'status', status, 'tries', ARGV[10], 'next_at', ARGV[11],
      'updated_at', NOWS)
    if ARGV[12] ~= '' then
      rcall('HSET', k, 'last_error', ARGV[12])
    else
      rcall('HDEL', k, 'last_error')
    end
    if status == 'pending' then
      rcall('ZADD', KDQ, ARGV[11], ARGV[6])
    else
      rcall('ZREM', KDQ, ARGV[6])
    end
  end
end
local head = rcall('ZRANGE', KDQ, 0, 0, 'WITHSCORES')
return { 'ok', head[2] or '', out }
