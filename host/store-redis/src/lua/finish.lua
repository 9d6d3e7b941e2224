local ID = ARGV[5]
local rk = runkey(ID)
-- MOVE_FIELDS first (handed to the one move of this run below), then the lease and the
-- flags that pick the transition, then the blobs the transition sets or drops (their
-- lengths spare `apply` an HSTRLEN each; they are nearly always absent).
local m = redis.call('HMGET', rk, 'status', 'created_at', 'wait_event', 'wait_run', 'cgate',
  'parked', 'lease_token', 'resumed', 'cancel_requested', 'error', 'output', 'resolution')
if not m[1] then return { 'not_found' } end
if m[1] ~= 'running' or m[7] ~= ARGV[6] then return { 'lease_lost' } end
-- The outcome's transition, then for a run that resumed and for one whose cancel was
-- requested: '0' (the same) or '1' and that case's transition.
local t = read_transition(8)
local o, alt = 8 + T_ARGS, {}
for _, case in ipairs({ 'resumed', 'cancel' }) do
  if ARGV[o] == '1' then
    alt[case] = o + 1
    o = o + 1 + T_ARGS
  else
    o = o + 1
  end
end
if m[9] == '1' and alt.cancel then
  t = read_transition(alt.cancel)
elseif m[8] == '1' and alt.resumed then
  t = read_transition(alt.resumed)
end
-- An output over a storage quota is refused before anything changes; the worker then
-- fails the run (an error is always stored). It is kept twice, as the run's output and
-- in the resolution its waiters receive, and charged by `move`.
if t.hasout == '1' then
  local full = run_full(ID, nil, mem(#t.out) + mem(#t.res))
  if full then return full end
end
local W = o
local extra = nil
if t.status == 'waiting' then extra = { 'wait', ARGV[W], 'wait_step', ARGV[W + 1] } end
local wake = 0
local lens = {}
for i, f in ipairs({ 'error', 'output', 'resolution' }) do lens[f] = m[9 + i] and #m[9 + i] or 0 end
if apply(ID, t, m, extra, lens) then wake = 1 end
if t.status == 'waiting' then
  local until_, on, target = ARGV[W + 2], ARGV[W + 3], ARGV[W + 4]
  if until_ ~= '' then redis.call('ZADD', P .. 'timeouts', until_, ID) end
  if on == 'event' then
    local ver = redis.call('HINCRBY', P .. 'waitver', target, 1)
    charge(ID, unpack_cost(ID, { 'wait_event', target }))
    redis.call('HSET', rk, 'wait_event', target, 'wait_ver', ver)
    redis.call('SADD', P .. 'waiters:' .. target, ID)
  else
    redis.call('HSET', rk, 'wait_run', target)
    redis.call('SADD', P .. 'rw:' .. target, ID)
    -- A run that already ended resolves the wait at once.
    local r = redis.call('HMGET', runkey(target), 'status', 'resolution')
    if not r[1] then
      resolve_wait(ID, ARGV[W + 5])
      wake = 1
    elseif r[2] then
      resolve_wait(ID, r[2])
      wake = 1
    end
  end
end
wake = wake + resolve_waiters_of(ID)
local pub = publish(wake, false)
-- ARGV[7] 'status': the run's status only (a wait may have resolved at once). A success
-- stores the output the caller sent: the reply leaves it out.
if ARGV[7] == 'status' then
  local status = t.status
  if status == 'waiting' then status = redis.call('HGET', rk, 'status') end
  return { 'ok', pub or false, status }
end
return { 'ok', pub or false, run_fields(ID, t.hasout == '1') }
