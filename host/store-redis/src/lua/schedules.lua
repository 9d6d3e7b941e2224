-- The tenant's scheduled functions: `crons` (name → schedule JSON), which deploys keep.
-- A tenant deployed before `crons` existed has it built once, from every function
-- (`meta.crons` marks it complete); deploys since then kept it, so the two agree.
if redis.call('HEXISTS', KMETA, 'crons') == 0 then
  for _, name in ipairs(redis.call('SMEMBERS', P .. 'fns')) do
    local s = redis.call('HGET', P .. 'fn:' .. name, 'schedule')
    if s then redis.call('HSET', P .. 'crons', name, s) end
  end
  redis.call('HSET', KMETA, 'crons', '1')
end
return { 'ok', redis.call('HGETALL', P .. 'crons') }
