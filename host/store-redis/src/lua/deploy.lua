local name = ARGV[5]
local fk = P .. 'fn:' .. name
-- A function is charged its component's size: a replacement the difference.
local was = rcall('HGET', fk, 'size_bytes')
local delta = C_FN + mem(tonumber(ARGV[7]))
if was then delta = delta - C_FN - mem(tonumber(was)) end
-- Its component and settings are stored once per version, for the runs that will pin
-- it; a version no run or function uses any more is collected with the components
-- (digests.lua).
local sv, blob = version_of(ARGV[6], ARGV[8])
local newset = rcall('HEXISTS', KSETS, sv) == 0
if newset then delta = delta + set_cost(#blob) end
if delta > 0 then
  local full = tenant_full(delta)
  if full then return full end
end
charge(nil, delta)
if newset then rcall('HSET', KSETS, sv, blob) end
-- Every run counts itself into `rdig` when it is created; only runs older than `rdig` make
-- digests.lua walk every run of the tenant once, in one call that blocks Redis for as
-- long as the walk takes. A tenant without runs yet has none of those: its `rdig` is
-- complete.
if rcall('HEXISTS', KMETA, 'rdig') == 0 then
  local runs = false
  for _, k in ipairs(run_indexes()) do
    if rcall('EXISTS', k) == 1 then
      runs = true
      break
    end
  end
  if not runs then rcall('HSET', KMETA, 'rdig', '1') end
end
local old = rcall('HGET', fk, 'events')
if old then
  for _, e in ipairs(cjson.decode(old)) do rcall('SREM', P .. 'sub:' .. e, name) end
end
local created = rcall('HGET', fk, 'created_at') or NOWS
rcall('HSET', fk, 'name', name, 'digest', ARGV[6], 'size_bytes', ARGV[7],
  'settings', ARGV[8], 'sv', sv, 'svd', '1', 'max_attempts', ARGV[9], 'events', ARGV[10],
  'created_at', created, 'updated_at', NOWS)
-- Its queue, read by every enqueue (the default one is left out).
local queue = cjson.decode(ARGV[8]).queue
if queue and queue ~= 'default' then
  rcall('HSET', fk, 'queue', queue)
  rcall('SADD', KQUEUES, queue)
  -- The tenant publishes per queue from now on (see `publish`).
  rcall('HSET', KMETA, 'mq', '1')
  METAH = nil
else
  rcall('HDEL', fk, 'queue')
end
-- `crons` names the scheduled functions, whose schedules the cron scheduler reads every
-- second (schedules.lua).
if ARGV[11] ~= '' then
  rcall('HSET', fk, 'schedule', ARGV[11])
  rcall('SADD', P .. 'crons', name)
else
  rcall('HDEL', fk, 'schedule')
  rcall('SREM', P .. 'crons', name)
end
rcall('SADD', P .. 'fns', name)
for i = 12, #ARGV do rcall('SADD', P .. 'sub:' .. ARGV[i], name) end
return { 'ok', rcall('HGETALL', fk) }
