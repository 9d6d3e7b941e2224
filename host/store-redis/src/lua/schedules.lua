-- The tenant's scheduled functions (`crons`, which deploys keep) and their schedules, as
-- a flat name/schedule list. A tenant deployed before `crons` existed has it built once,
-- from every function (`meta.crons` marks it complete); deploys since kept it.
if rcall('HEXISTS', KMETA, 'crons') == 0 then
  for _, name in ipairs(rcall('SMEMBERS', P .. 'fns')) do
    if rcall('HEXISTS', P .. 'fn:' .. name, 'schedule') == 1 then
      rcall('SADD', P .. 'crons', name)
    end
  end
  rcall('HSET', KMETA, 'crons', '1')
end
local out = {}
for _, name in ipairs(rcall('SMEMBERS', P .. 'crons')) do
  local s = rcall('HGET', P .. 'fn:' .. name, 'schedule')
  if s then
    out[#out + 1] = name
    out[#out + 1] = s
  end
end
return { 'ok', out }
