local EID, NAME, DATA, RES, TRACE, EXPECTED = ARGV[5], ARGV[6], ARGV[7], ARGV[8], ARGV[9],
  ARGV[10]
local m = tonumber(ARGV[11])
local seen = rcall('HGET', P .. 'events', EID)
if seen and tonumber(seen) > NOW - WINDOW then return { 'dup' } end
local wk = P .. 'waiters:' .. NAME
local ver = rcall('HGET', P .. 'waitver', NAME) or '0'
if (EXPECTED == '' and rcall('SCARD', wk) > 0) or (EXPECTED ~= '' and EXPECTED ~= ver) then
  -- Rust reads the waiters a page at a time (WAITERS) and matches their filters.
  return { 'match', ver }
end
local subs = rcall('SMEMBERS', P .. 'sub:' .. NAME)
table.sort(subs)
-- The subscribers Rust computed flow arguments for must be today's, with today's settings.
local sb = 12 + 2 * m
local k = tonumber(ARGV[sb])
local stride = 3 + FLOW_ARGS
if k ~= #subs then return { 'stale' } end
for i, fname in ipairs(subs) do
  local o = sb + 1 + (i - 1) * stride
  if ARGV[o] ~= fname or (settings_version(P .. 'fn:' .. fname) or '') ~= ARGV[o + 2] then
    return { 'stale' }
  end
  local fl = read_flow(o + 3)
  if fl.dgate ~= '' and debounce_moved(fl) then return { 'stale' } end
end
-- max_queued: every subscriber counts (wasq_core::lifecycle::Admission::Event).
local maxq = quota('max_queued')
if maxq and k > 0 and queued_count() + k > maxq then
  return { 'quota', I(maxq) }
end
-- Storage: the event's dedup record and every run it starts, refused as a whole.
local cost = event_cost(EID)
local maxrun = quota('max_run_bytes')
for i, fname in ipairs(subs) do
  local o = sb + 1 + (i - 1) * stride
  local c = run_cost(DATA, 'event:' .. NAME, ARGV[o + 2], 'event:' .. EID, '', read_flow(o + 3), '',
    TRACE)
  if maxrun and c > maxrun then return { 'storage', 'run', '0', I(c), I(maxrun) } end
  cost = cost + c
end
local full = tenant_full(cost)
if full then return full end
if seen then charge(nil, -event_cost(EID)) end
rcall('HSET', P .. 'events', EID, NOWS)
rcall('ZADD', P .. 'evz', NOWS, EID)
charge(nil, event_cost(EID))
forget_events(100)
local wake = 0
local started, resumed = {}, {}
for i, fname in ipairs(subs) do
  local o = sb + 1 + (i - 1) * stride
  local fl = read_flow(o + 3)
  fl.enforce = '0'
  -- One run per function per event, however often it is delivered.
  local id, created, _, woke = insert_run(ARGV[o + 1], fname, DATA, 'event:' .. NAME, '',
    'event:' .. EID, '', '', '', TRACE, ARGV[o + 2], fl)
  if id then
    started[#started + 1] = id
    if created then wake = wake + 1 + woke end
  end
end
for i = 0, m - 1 do
  local id, wver = ARGV[12 + 2 * i], ARGV[13 + 2 * i]
  local r = rcall('HMGET', runkey(id), 'status', 'wait_event', 'wait_ver')
  if r[1] == 'waiting' and r[2] == NAME and r[3] == wver then
    resolve_wait(id, RES)
    resumed[#resumed + 1] = id
    wake = wake + 1
  end
end
local pub = publish(wake, false)
return { 'ok', pub or false, started, resumed }
