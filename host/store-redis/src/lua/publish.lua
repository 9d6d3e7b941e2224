-- The tenant's schedule, after the prelude in the scripts' library: when it has work
-- next, for every queue and for each, published to the global keys (`due`, `due:<queue>`)
-- with wake-ups (`wake`, `wake:<queue>`). apply_hint (lua/apply_hint.lua) comes first.

-- Runs this call put in the lane of queue `name` ('default' for the default one's).
local function lane_added(name)
  if name == 'default' then name = '' end
  return LANEADD[name] or 0
end

-- Whether the tenant may start another run (its max_running quota).
local function has_room()
  local maxr = quota('max_running')
  return not maxr or leased() < maxr
end

-- The earliest of the tenant's not yet due runs, lease expiries, wait timeouts and
-- throttle windows opening (what any claim of the tenant takes care of, whatever queues
-- it names); nil when it has none. A zset whose head this call knows (HEADS) is not read.
local function maintenance_due()
  local best = nil
  for _, z in ipairs({ KREADY, KLEASES, KTIMEOUTS, KGTIMER }) do
    local s = HEADS[z]
    if s == nil then s = head_of(z) end
    if s and (best == nil or s < best) then best = s end
  end
  return best
end

-- The tenant's next due time, for every queue and, when it has named queues (`multi`),
-- for each (`per`: queue ('default' for the default one) -> time): 0 (now) where a lane
-- holds runs it has room to start, else maintenance_due(); nil when it has none. Parked
-- runs wait for an event of their gate.
local function next_due(multi)
  local room, maint = nil, false
  local per, n = {}, nil
  local function queue_due(name, k)
    local v
    -- Runs this call put in the lane (and, not being a claim, left there) make it due
    -- now without counting the lane.
    if (not TAKES and lane_added(name) > 0) or rcall('ZCARD', k) > 0 then
      if room == nil then room = has_room() end
      if room then v = 0 end
    end
    if v == nil then
      if maint == false then maint = maintenance_due() end
      v = maint
    end
    per[name] = v
    if v and (n == nil or v < n) then n = v end
  end
  queue_due('default', KQ)
  if multi then
    for _, q in ipairs(other_queues()) do queue_due(q, lane(q)) end
  end
  return n, per
end

-- Publishes the tenant's next due time to the global schedule and pushes `wake` tokens.
-- A tenant with only the default queue publishes to `due` and `wake`, as before queues
-- existed (and costs no more). One with named queues (`mq` in its meta, set by the
-- deploy that named the first) publishes its next due time to `dueq` instead, each
-- queue's to `due:<queue>`, and wake-ups to `wake:<queue>` too: one per run that entered
-- the queue's lane, one where its due time came earlier.
-- Single node (G set): done here, atomically. Cluster (G empty): the global keys live in
-- another slot, so the script returns {seq, next, wake} (with named queues: then 'mq'
-- and (queue, next, wake) triples) and the caller applies it with the hint script, which
-- drops updates older than the newest seq it has seen.
-- Applies what `publish` decided to the global keys (single node) or returns it for the
-- caller to apply (Cluster): see `publish`.
-- `old`: see apply_hint.
local function send_hint(seq, ns, wake, update, qs, old)
  if G ~= '' then
    apply_hint(G, TENANT, ns, wake, update, qs, old)
    return false
  end
  local out = { seq, ns, wake }
  if qs then
    out[4] = 'mq'
    for _, v in ipairs(qs) do out[#out + 1] = v end
  end
  return out
end

-- Whether this call can only have moved the tenant's due time later than `published`
-- (the `next` it published last), a time still to come: nothing it added to a
-- maintenance zset comes before it, and the lane is empty (runs in it make the tenant
-- due now, or as soon as a slot frees, which no ZADD shows). An end or a renewal of the
-- run that set the due time (its lease's expiry) is such a call.
local function only_later(published)
  local p = published and tonumber(published)
  if not p or p <= NOW or (MINADD and MINADD < p) then return false end
  return rcall('ZCARD', KQ) == 0
end

-- `h`: the tenant's meta (tenant_meta), when the caller has it.
-- A due time that can only have moved later stays published as it was: published early,
-- it costs one visit that finds nothing, and a claim that takes nothing publishes the
-- truth (`force`). Publishing it at once cost a run that ends on an idle queue seven
-- commands (the heads of four zsets, the meta, the global schedule), and a renewal as
-- many. Tenants with named queues publish every change.
local function publish(wake, force, h)
  zflush()
  local meta = KMETA
  h = h or tenant_meta()
  local multi = h[2] ~= false
  FEEDUNTIL = h[3]
  if not force and not multi and wake == 0 and next(LANEADD) == nil and only_later(h[1]) then
    return false
  end
  local n, per = next_due(multi)
  local ns = ''
  if n then ns = I(n) end
  local changed = force or h[1] ~= ns
  local qs = nil
  if multi then
    qs = {}
    local names, fields = {}, {}
    for q in pairs(per) do
      names[#names + 1] = q
      fields[#fields + 1] = 'next:' .. q
    end
    local was = rcall('HMGET', meta, unpack(fields))
    for i, q in ipairs(names) do
      local v = per[q]
      local vs = ''
      if v then vs = I(v) end
      local add = lane_added(q)
      local qchanged = force or was[i] ~= vs
      if qchanged then
        changed = true
        rcall('HSET', meta, fields[i], vs)
      end
      if qchanged or add > 0 then
        qs[#qs + 1] = q
        qs[#qs + 1] = vs
        qs[#qs + 1] = add
      end
    end
    if not changed and wake == 0 and #qs == 0 then return false end
  elseif not changed and wake == 0 then
    return false
  end
  -- On a single node only this tenant's calls write its entry in `due`, each after
  -- writing the same time to `next`: what `next` held is the entry (no ZSCORE).
  local seq, was = 0, h[1]
  if changed then
    -- The sequence orders hints on Cluster (see hint.lua); a single node applies the
    -- hint here, in order, and needs none.
    if G == '' then seq = rcall('HINCRBY', meta, 'seq', '1') end
    rcall('HSET', meta, 'next', ns)
    h[1] = ns
  end
  return send_hint(seq, ns, wake, changed, qs, was)
end

-- `publish` after a transition that only added runs due now (an enqueue): they cannot
-- make a due time later, so when the tenant's (and their queues') are 'now' already only
-- the wake-ups are left to do.
local function publish_added(wake)
  zflush()
  local h = tenant_meta()
  FEEDUNTIL = h[3]
  if h[1] ~= '0' then return publish(wake, false, h) end
  local qs = nil
  if h[2] then
    local fields = {}
    qs = {}
    for k, n in pairs(LANEADD) do
      local q = k
      if q == '' then q = 'default' end
      fields[#fields + 1] = 'next:' .. q
      qs[#qs + 1] = q
      qs[#qs + 1] = '0'
      qs[#qs + 1] = n
    end
    if #fields > 0 then
      for _, v in ipairs(rcall('HMGET', KMETA, unpack(fields))) do
        if v ~= '0' then return publish(wake, false, h) end
      end
    end
  end
  if wake == 0 and (not qs or #qs == 0) then return false end
  return send_hint(0, '0', wake, false, qs)
end
