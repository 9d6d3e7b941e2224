local function apply_hint(G, tenant, ns, wake, update)
  if update then
    local old = redis.call('ZSCORE', G .. 'due', tenant)
    if ns == '' then
      redis.call('ZREM', G .. 'due', tenant)
    else
      redis.call('ZADD', G .. 'due', ns, tenant)
      -- An earlier due time: waiters must recompute how long they sleep.
      if (not old or tonumber(ns) < tonumber(old)) and wake < 1 then wake = 1 end
    end
  end
  if wake > 0 then
    local tokens = {}
    for i = 1, math.min(wake, @WAKEMAX@) do tokens[i] = '1' end
    redis.call('LPUSH', G .. 'wake', unpack(tokens))
    redis.call('LTRIM', G .. 'wake', 0, @WAKEMAX@ - 1)
  end
end
