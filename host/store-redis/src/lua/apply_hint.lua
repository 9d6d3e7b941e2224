-- Applies a tenant's published schedule to the global keys: its next due time in `due`
-- (for workers taking every queue), each queue's in `due:<queue>` (for workers naming
-- queues), and wake-up tokens in `wake` and `wake:<queue>`. `qs`: flat (queue, next due
-- or '', runs that entered its lane) triples; `update`: the due times are newer than
-- what the keys hold.
local function push_tokens(key, n)
  local tokens = {}
  for i = 1, math.min(n, @WAKEMAX@) do tokens[i] = '1' end
  redis.call('LPUSH', key, unpack(tokens))
  redis.call('LTRIM', key, 0, @WAKEMAX@ - 1)
end

local function set_due(key, tenant, ns, wake)
  local old = redis.call('ZSCORE', key, tenant)
  if ns == '' then
    redis.call('ZREM', key, tenant)
  else
    redis.call('ZADD', key, ns, tenant)
    -- An earlier due time: waiters must recompute how long they sleep.
    if (not old or tonumber(ns) < tonumber(old)) and wake < 1 then wake = 1 end
  end
  return wake
end

local function apply_hint(G, tenant, ns, wake, update, qs)
  if update then wake = set_due(G .. 'due', tenant, ns, wake) end
  if wake > 0 then push_tokens(G .. 'wake', wake) end
  for i = 1, #qs, 3 do
    local q, qwake = qs[i], tonumber(qs[i + 2])
    if update then qwake = set_due(G .. 'due:' .. q, tenant, qs[i + 1], qwake) end
    if qwake > 0 then push_tokens(G .. 'wake:' .. q, qwake) end
  end
end
