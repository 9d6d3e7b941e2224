local ID = ARGV[5]
local rk = runkey(ID)
local r = rcall('HMGET', rk, 'status', 'attempt')
if not r[1] then return { 'not_found' } end
if r[1] ~= ARGV[6] or (r[2] or '0') ~= ARGV[7] then return { 'stale' } end
-- A retried run is queued like a new one: the tenant's max_queued applies.
local maxq = quota('max_queued')
if maxq and queued_count() + 1 > maxq * tonumber(ARGV[9]) then
  return { 'quota' }
end
rcall('HINCRBY', rk, 'max_attempts', tonumber(ARGV[8]))
apply(ID, read_transition(10))
local L = 10 + T_ARGS
append_logs(ID, L + 2, ARGV[L], ARGV[L + 1])
local pub = publish(1, false)
return { 'ok', pub or false, run_fields(ID) }
