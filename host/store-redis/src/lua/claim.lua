-- What a claim starts from a run in each claimable status: (attempt delta, resumed, lowest
-- attempt), computed in scripts.rs from wasq_core::lifecycle::claimed_attempt.
local CLAIM_STEP = { queued = { @CLAIM_QUEUED@ }, sleeping = { @CLAIM_SLEEPING@ } }
-- Which starts count against a throttle, by status: (from attempt 0, from a later
-- attempt), computed in scripts.rs from wasq_core::lifecycle::throttles_start.
local THROTTLES = { queued = { @THROTTLES_QUEUED@ }, sleeping = { @THROTTLES_SLEEPING@ } }
-- (ARGV[7], the worker's name, is not stored: an execution keeps it as JSON, ARGV[8].)
local LIMIT, LEASE, WORKER_JSON = tonumber(ARGV[5]), tonumber(ARGV[6]), ARGV[8]
local wake = 0
TAKES = true
-- The tenant's meta (what `publish` reads, and the quotas), read first: a tenant without
-- `mq` has no named queues, and the claim need not list them.
local META = tenant_meta()
if not META[2] then QLIST = {} end
-- Runs whose worker stopped renewing. What becomes of each (queued again, failed for
-- good, cancelled) is wasq_core::lifecycle::lease_expired's to say: without transitions
-- (ARGV[10] = '') the script only answers which runs need one; with them (ARGV[10] = n,
-- then n × (id, lease token, T_ARGS transition)) it applies each to a run still under
-- that lease, and leaves runs that expired in between to the next claim. ARGV[11]: the
-- queues to take from, comma-separated, in order ('': every queue, as one).
-- (Each of the four maintenance zsets is read by due_members, which notes its head for
-- `publish`.)
local expired = due_members(KLEASES, '@REAP_BATCH@')
if ARGV[10] == '' then
  local need = {}
  for _, id in ipairs(expired) do
    local r = rcall('HMGET', runkey(id), 'status', 'lease_token', 'worker', 'attempt',
      'max_attempts', 'cancel_requested')
    if r[1] == 'running' then
      need[#need + 1] = { id, r[2], r[3] or lease_holder(id), r[4], r[5], r[6] or '0' }
    end
  end
  if #need > 0 then return { 'reap', need } end
end
local given = {}
if ARGV[10] ~= '' then
  for j = 0, tonumber(ARGV[10]) - 1 do
    local o = 12 + j * (2 + T_ARGS)
    given[ARGV[o]] = { ARGV[o + 1], o + 2 }
  end
end
for _, id in ipairs(expired) do
  local r = rcall('HMGET', runkey(id), 'status', 'lease_token')
  if r[1] ~= 'running' then
    rcall('ZREM', KLEASES, id)
  elseif given[id] and given[id][1] == r[2] then
    if apply(id, read_transition(given[id][2])) then wake = wake + 1 end
    wake = wake + resolve_waiters_of(id)
  end
end
-- Waits whose time is up resolve as timed out.
for _, id in ipairs(due_members(KTIMEOUTS, '@REAP_BATCH@')) do
  if rcall('HGET', runkey(id), 'status') == 'waiting' then
    resolve_wait(id, @TIMED_OUT@)
    wake = wake + 1
  else
    rcall('ZREM', KTIMEOUTS, id)
  end
end
-- Throttle windows that opened: as many parked runs as they have room for go back into
-- the lane, best rank first; while runs stay parked the gate's timer is set to when the
-- window opens next (counting the let-through runs as started now).
for _, gate in ipairs(due_members(KGTIMER, '@REAP_BATCH@')) do
  local pk = P .. 'park:' .. gate
  local cfg = rcall('HGET', KTCFG, gate)
  local again = nil
  if cfg and rcall('ZCARD', pk) > 0 then
    local sep = string.find(cfg, '|', 1, true)
    local limit, period = tonumber(string.sub(cfg, 1, sep - 1)), tonumber(string.sub(cfg, sep + 1))
    local n, oldest = 0, NOW
    for i, t in ipairs(rcall('LRANGE', P .. 'win:' .. gate, 0, limit - 1)) do
      if tonumber(t) <= NOW - period then break end
      n, oldest = i, tonumber(t)
    end
    if limit > n then
      local p = rcall('ZPOPMIN', pk, limit - n)
      for i = 1, #p, 2 do unpark(p[i], p[i + 1]) end
    end
    if rcall('ZCARD', pk) > 0 then again = math.max(oldest + period, NOW + 1) end
  end
  if again then
    zadd_maint(KGTIMER, I(again), gate)
  else
    rcall('ZREM', KGTIMER, gate)
    rcall('HDEL', KTCFG, gate)
  end
end
-- Due runs enter the lane, ranked by due time + priority offset.
-- (Workers of another queue learn of them from the due times published after.)
for _, id in ipairs(due_members(KREADY, '@PROMOTE_BATCH@')) do
  local h = rcall('HMGET', runkey(id), 'due_at', 'rank_offset', 'qu')
  rcall('ZREM', KREADY, id)
  rcall('ZADD', lane(h[3] or nil), I(tonumber(h[1]) + tonumber(h[2] or '0')), id)
end
local room = LIMIT
local maxr = quota('max_running')
if maxr then room = math.min(room, maxr - leased()) end
-- The claimed runs, flat (append_run), packed into the reply, and how many.
local out, claimed = {}, 0
local parks = @PARK_BUDGET@
local ATT_COST, claimed_bytes = C_ATT + #WORKER_JSON, 0
-- Every lease of this claim expires at the same time.
local EXPIRES = I(NOW + LEASE)
-- The lanes to take from, in order: the queues named (the default one's is `q`), or
-- every lane as one (`merged`): then each run is the best head among them.
local lanes, merged = {}, false
if ARGV[11] == '' then
  lanes[1] = KQ
  for _, q in ipairs(other_queues()) do lanes[#lanes + 1] = lane(q) end
  merged = #lanes > 1
else
  for q in string.gmatch(ARGV[11], '[^,]+') do
    if q == 'default' then lanes[#lanes + 1] = KQ else lanes[#lanes + 1] = lane(q) end
  end
end
-- A lane's best runs, fetched a batch at a time: the loop only takes runs out of the
-- lane (leased, parked or stale), so the next batch starts at the lane's head again, and
-- a batch shorter than asked for was the whole lane (`last`). Merged lanes are read one
-- head each per run.
local head, hi, li, last = {}, 1, 1, false
local function next_head()
  if merged then
    local best, bscore, bkey = nil, nil, nil
    for _, k in ipairs(lanes) do
      zflush(k)
      local h = rcall('ZRANGE', k, '0', '0', 'WITHSCORES')
      if h[1] then
        local sc = tonumber(h[2])
        if not best or sc < bscore or (sc == bscore and h[1] < best) then
          best, bscore, bkey = h[1], sc, k
        end
      end
    end
    if best then return best, I(bscore), bkey end
    return nil
  end
  while li <= #lanes do
    if hi > #head and not last then
      local want = math.min(room - claimed, 100)
      zflush(lanes[li])
      head, hi = rcall('ZRANGE', lanes[li], 0, want - 1, 'WITHSCORES'), 1
      last = #head < 2 * want
    end
    if head[hi] then
      local id, score = head[hi], head[hi + 1]
      hi = hi + 2
      return id, score, lanes[li]
    end
    li, head, hi, last = li + 1, {}, 1, false
  end
  return nil
end
while claimed < room and parks > 0 do
  local id, score, from = next_head()
  if not id then break end
  local r = run_hash(id)
  local status, cgate, attempt, climit = r.status, r.cgate, r.attempt or '0', r.climit
  local tgate, tlimit, tperiod = r.tgate, r.tlimit, r.tperiod
  local throttled = false
  if tgate and THROTTLES[status] then
    if attempt == '0' then throttled = THROTTLES[status][1] else throttled = THROTTLES[status][2] end
  end
  if status ~= 'queued' and status ~= 'sleeping' then
    rcall('ZREM', from, id)
  elseif cgate and rcall('SCARD', P .. 'crun:' .. cgate) >= tonumber(climit) then
    park(id, cgate, score, r.qu)
    parks = parks - 1
  elseif throttled and window_full(tgate, tonumber(tlimit), tonumber(tperiod)) then
    park(id, tgate, score, r.qu)
    rcall('HSET', KTCFG, tgate, tlimit .. '|' .. tperiod)
    zadd_maint(KGTIMER, I(window_full(tgate, tonumber(tlimit), tonumber(tperiod))), tgate, 'LT')
    parks = parks - 1
  else
    if throttled then window_log(tgate, tonumber(tlimit)) end
    -- The attempt this claim starts, and whether it resumes one: core's rule
    -- (wasq_core::lifecycle::claimed_attempt) as a table by status, CLAIM_STEP.
    local step = CLAIM_STEP[status]
    local n, resumed = math.max(tonumber(attempt) + step[1], step[3]), step[2]
    -- The new execution's record is charged to the run within the move (its fields hold
    -- no blob, so the move charges nothing itself) and to the tenant once per claim.
    local att, token = I(n), I(tonumber(r.lease_token or '0') + 1)
    local sbytes = I(tonumber(r.sbytes or '0') + ATT_COST)
    -- (A lease's fields hold no blob: NOBLOB. Its expiry is its score in `leases`, its
    -- worker in the execution pushed below: see `move`.)
    -- `resumed` is absent while '0': a run's first claim leaves it out (a field fewer for
    -- this HSET, and for every scan of the run's hash until it ends).
    local set = { 'attempt', att, 'lease_token', token, 'sbytes', sbytes }
    if resumed ~= (r.resumed or '0') then set[7], set[8] = 'resumed', resumed end
    move(id, 'running', set, { status, r.created_at, r.wait_event, r.wait_run, cgate, r.parked,
      r.qu }, NOBLOB, from, r['function'], EXPIRES)
    rcall('RPUSH', P .. 'att:' .. id, att .. '|' .. NOWS .. '|' .. WORKER_JSON)
    claimed_bytes = claimed_bytes + ATT_COST
    -- The run as the move left it: what it read (a constructor of RUN_FIELDS' values,
    -- which scripts.rs writes out: a table made at its full size at once, and no loop),
    -- with what the move wrote (`move` sets status, updated_at and the lease, and drops
    -- `parked`, which replies leave out).
    local fields = with_input(id, { @RUN_FIELDS_OF_R@ }, r)
    fields[RUN_AT.status], fields[RUN_AT.updated_at], fields[RUN_AT.attempt] = 'running', NOWS, att
    fields[RUN_AT.lease_expires_at], fields[RUN_AT.lease_token] = EXPIRES, token
    fields[RUN_AT.sbytes] = sbytes
    -- What the end of this lease needs of the run that no one but its holder changes
    -- while it holds it and the reply does not carry, read here already: the store hands
    -- it back with the end, with the creation time and the open execution it knows (see
    -- `lease_memo` in finish.lua), and the end reads five fields where it read thirteen.
    -- Nearly always `||0|||`, which the store knows: false then (a string made per run
    -- costs its concatenation and, with the larger reply, more of Lua's collector). A gate
    -- (the tenant's key text) or queue with a `|` in it would split the memo wrong: ''
    -- then, no memo, and the end reads the run whole.
    local memo = false
    if cgate or r.qu or resumed ~= '0' or r.error or r.output or r.resolution then
      if (cgate and string.find(cgate, '|', 1, true))
        or (r.qu and string.find(r.qu, '|', 1, true)) then
        memo = ''
      else
        memo = (cgate or '') .. '|' .. (r.qu or '') .. '|' .. resumed .. '|'
          .. (r.error and #r.error or '') .. '|' .. (r.output and #r.output or '') .. '|'
          .. (r.resolution and #r.resolution or '')
      end
    end
    append_run(out, id, r.nosteps == '1', fields, memo)
    claimed = claimed + 1
    -- The index writes of the runs claimed after the second go out together after the
    -- loop (zdefer): a claim that finds one or two runs (a worker that keeps up) pays
    -- nothing for the batching.
    if claimed == 2 then zdefer(room - 2) end
  end
end
-- The deferred index writes go out before the lanes are counted below.
zflush()
charge(nil, claimed_bytes)
-- Wake other workers only for what this claim left behind.
if wake > 0 then
  local left = rcall('ZCARD', KQ)
  for _, q in ipairs(other_queues()) do left = left + rcall('ZCARD', lane(q)) end
  wake = math.min(wake, left)
end
-- A visit that found nothing republishes anyway, repairing a stale global hint.
local pub = publish(wake, ARGV[9] == '1' or claimed == 0, META)
-- Packed (cmsgpack, built into Redis's Lua): the worker reads one string in one pass
-- instead of a value at a time, for about what converting `out` to RESP costs here.
return { 'ok', pub or false, cmsgpack.pack(out) }
