local id, kind = ARGV[5], ARGV[7]
local bad = check_lease(id, ARGV[6])
if bad then return { bad } end
local rk = runkey(id)
if kind == 'progress' then
  -- Progress replaces itself (bounded by the sandbox): charged, never refused.
  charge(id, blob_delta(id, { 'progress', ARGV[8] }))
  rcall('HSET', rk, 'progress', ARGV[8], 'updated_at', NOWS)
  return { 'ok' }
end
-- After the two cut markers comes the number of lines, then the lines (to the end).
if kind == 'step' then
  local field, output = ARGV[8], ARGV[9]
  -- A step stored already (a replayed record) adds nothing; a new one must fit.
  if rcall('HEXISTS', P .. 'steps:' .. id, field) == 0 then
    local full = run_full(id, nil, step_cost(id, field, output, nil, true))
    if full then return full end
  end
  append_logs(id, 13, ARGV[10], ARGV[11])
  write_step(id, field, output, rcall('HGET', rk, 'attempt'))
else
  append_logs(id, 11, ARGV[8], ARGV[9])
end
return { 'ok' }
