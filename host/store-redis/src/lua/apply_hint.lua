-- Applies a tenant's published schedule to the global keys (see `publish`): its next due
-- time in `due` (a tenant with only the default queue) or `dueq` (one with named queues,
-- then each queue's in `due:<queue>`), and wake-up tokens in `wake` and `wake:<queue>`.
-- `qs`: nil for a tenant with only the default queue, else flat (queue, next due or '',
-- runs that entered its lane) triples; `update`: the due times are newer than what the
-- keys hold.
-- A token names the tenant (the worker it wakes visits that tenant in the claim that reads
-- the schedule, one round trip instead of two). A list that holds WAKEMAX tokens already
-- stays as it is: while no worker waits, as when all are busy, an enqueue costs an LLEN,
-- not a push and a trim, and any token wakes a worker, whose claim reads the schedule.
local function push_tokens(key, n, tenant)
  if rcall('LLEN', key) >= @WAKEMAX@ then return end
  local tokens = {}
  for i = 1, math.min(n, @WAKEMAX@) do tokens[i] = tenant end
  rcall('LPUSH', key, unpack(tokens))
  rcall('LTRIM', key, 0, @WAKEMAX@ - 1)
end

-- `old`: the tenant's entry in `key` when the caller knows it ('' or false: none), else
-- nil (read here).
local function set_due(key, tenant, ns, wake, old)
  if ns == '' then
    rcall('ZREM', key, tenant)
  else
    if old == nil then old = rcall('ZSCORE', key, tenant) end
    if old == '' then old = false end
    rcall('ZADD', key, ns, tenant)
    -- An earlier due time: waiters must recompute how long they sleep.
    if (not old or tonumber(ns) < tonumber(old)) and wake < 1 then wake = 1 end
  end
  return wake
end

-- `old`: the due time the tenant published last, when the caller knows it (see set_due).
local function apply_hint(G, tenant, ns, wake, update, qs, old)
  if not qs then
    if update then wake = set_due(G .. 'due', tenant, ns, wake, old) end
    if wake > 0 then push_tokens(G .. 'wake', wake, tenant) end
    return
  end
  if update then
    -- It had only the default queue until a deploy named another.
    rcall('ZREM', G .. 'due', tenant)
    wake = set_due(G .. 'dueq', tenant, ns, wake)
  end
  if wake > 0 then push_tokens(G .. 'wake', wake, tenant) end
  for i = 1, #qs, 3 do
    local q, qwake = qs[i], tonumber(qs[i + 2])
    if update then qwake = set_due(G .. 'due:' .. q, tenant, qs[i + 1], qwake) end
    if qwake > 0 then push_tokens(G .. 'wake:' .. q, qwake, tenant) end
  end
end
