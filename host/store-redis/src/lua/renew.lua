local exp = I(NOW + tonumber(ARGV[5]))
local lost, cancelling = {}, {}
for i = 6, #ARGV, 2 do
  local id, token = ARGV[i], ARGV[i + 1]
  local rk = runkey(id)
  local r = rcall('HMGET', rk, 'status', 'lease_token', 'cancel_requested')
  if r[1] == 'running' and r[2] == token and r[3] ~= '1' then
    -- A lease's expiry is its score in `leases` alone (see `move`).
    zadd_maint(KLEASES, exp, id)
  elseif r[1] == 'running' and r[2] == token then
    cancelling[#cancelling + 1] = id
  else
    lost[#lost + 1] = id
  end
end
local pub = publish(0, false)
return { 'ok', pub or false, lost, cancelling }
