local ID = ARGV[5]
local rk = runkey(ID)
local status = rcall('HGET', rk, 'status')
if not status then return { 'not_found' } end
if status ~= ARGV[6] then return { 'stale' } end
local wake = 0
if ARGV[7] == 'mark' then
  local fields = { 'error', ARGV[8] }
  charge(ID, blob_delta(ID, fields))
  rcall('HSET', rk, 'cancel_requested', '1', 'updated_at', NOWS, unpack(fields))
else
  apply(ID, read_transition(9))
  wake = resolve_waiters_of(ID)
end
append_logs(ID, 11 + T_ARGS, ARGV[9 + T_ARGS], ARGV[10 + T_ARGS])
local pub = publish(wake, false)
return { 'ok', pub or false, run_fields(ID) }
