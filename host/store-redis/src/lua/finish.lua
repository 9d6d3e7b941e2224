-- Ends attempts of the tenant's runs, each with the records its attempt had not stored
-- yet (Queue::end_attempts): one end is stored whole or not at all, and each is answered
-- on its own. ARGV[5]: what each answers ('run' or 'status'), ARGV[6]: how many ends.
local REPLY, wake, answers = ARGV[5], 0, {}
-- Each end's index writes go out with the others' (zdefer). ENDED: the runs that ended,
-- while deferred; the runs waiting for them resume after the loop.
local NENDS, ENDED = tonumber(ARGV[6]), nil
zdefer(NENDS)
if ZB then ENDED = {} end

-- The cases a finish may send a transition of its own for (made once, not per end).
local CASES = { 'resumed', 'cancel' }

-- The arguments of the end at ARGV[o] (see FINISH in scripts.rs): its records, its
-- transitions, its wait; and where the next end starts.
local function parse(o)
  local e = { id = ARGV[o], token = ARGV[o + 1], memo = ARGV[o + 2], recs = {} }
  local nrec = tonumber(ARGV[o + 3])
  o = o + 4
  for i = 1, nrec do
    local kind = ARGV[o]
    if kind == 'step' then
      local n = tonumber(ARGV[o + 5])
      e.recs[i] = { kind = kind, field = ARGV[o + 1], out = ARGV[o + 2], mrun = ARGV[o + 3],
        mten = ARGV[o + 4], first = o + 6, last = o + 5 + n }
      o = o + 6 + n
    elseif kind == 'logs' then
      local n = tonumber(ARGV[o + 3])
      e.recs[i] = { kind = kind, mrun = ARGV[o + 1], mten = ARGV[o + 2], first = o + 4,
        last = o + 3 + n }
      o = o + 4 + n
    else
      e.recs[i] = { kind = kind, blob = ARGV[o + 1] }
      o = o + 2
    end
  end
  -- The outcome's transition (a success as 'S' and six values: read_transition), then
  -- for a run that resumed and for one whose cancel was requested: '0' (the same) or '1'
  -- and that case's transition; then '0' or '1' and the wait's arguments.
  e.t = o
  if ARGV[o] == @SUCCESS@ then o = o + @SUCCESS_ARGS@ else o = o + T_ARGS end
  for _, case in ipairs(CASES) do
    if ARGV[o] == '1' then
      e[case] = o + 1
      o = o + 1 + T_ARGS
    else
      o = o + 1
    end
  end
  if ARGV[o] == '1' then
    e.wait = o + 1
    o = o + 7
  else
    o = o + 1
  end
  return e, o
end

-- What an end's new steps and its output add to its run's bytes; the steps already
-- stored (a replayed record) are marked `old` and add nothing, the run's first step
-- `first_step`. A run without steps yet (`nosteps`) has no step hash to look in.
local function adding(e, t, nosteps)
  local n, any = 0, t.hasout == '1'
  if any then n = mem(#t.out) + mem(#t.res) end
  local sk, seen = P .. 'steps:' .. e.id, {}
  for _, r in ipairs(e.recs) do
    if r.kind == 'step' then
      if seen[r.field] or (not nosteps and rcall('HEXISTS', sk, r.field) == 1) then
        r.old = true
      else
        seen[r.field] = true
        any = true
        -- The run's first step creates its step hash (see step_cost).
        n = n + step_cost(e.id, r.field, r.out, nosteps, true)
        r.first_step, nosteps = nosteps, false
      end
    end
  end
  return any and n
end

-- A lease's memo (claim.lua): the run's created_at, cgate, qu, resumed, the lengths of
-- its error, output and resolution ('' for none), and its open execution as its attempts
-- list holds it. No one but the lease's holder changes these while it holds the lease,
-- but for the error a cancel stores with its request (`cancel_requested`): what the claim
-- read is what the run has at the end.
local MEMO = '^([^|]*)|([^|]*)|([^|]*)|([^|]*)|([^|]*)|([^|]*)|([^|]*)|(([^|]*)|.*)$'
local function len_of(s) if s == '' then return 0 end return tonumber(s) end
local function absent(s) return s ~= '' and s end

-- What an end reads of its run (the fence, what picks its transition, what the move and
-- its charges need): MOVE_FIELDS' values (`pre`, handed to the one move of this run
-- below), lease_token, resumed, cancel_requested, the blobs' lengths (`lens`, which spare
-- `apply` an HSTRLEN each), nosteps, attempt, sbytes, and the open execution (nil: read
-- it). Each field an HMGET asks for costs about 2k instructions, a scan of the whole
-- packed hash when it is absent: with the lease's memo (an end from the process that
-- claimed the run) it asks for the five that can change under a lease, else for all
-- thirteen. A running run waits for nothing and is parked nowhere (its claim dropped
-- `parked`), so three of MOVE_FIELDS are never read.
local function lease_memo(e, rk)
  if e.memo ~= '' then
    local created, cgate, qu, resumed, elen, olen, rlen, open, att = string.match(e.memo, MEMO)
    if open then
      local h = rcall('HMGET', rk, 'status', 'lease_token', 'cancel_requested', 'nosteps',
        'sbytes')
      local el = len_of(elen)
      if h[3] == '1' then el = rcall('HSTRLEN', rk, 'error') end
      return { h[1], created, false, false, absent(cgate), false, absent(qu) }, h[2], resumed,
        h[3], { error = el, output = len_of(olen), resolution = len_of(rlen),
        finished_at = 0 }, h[4], att, h[5], open
    end
  end
  local h = rcall('HMGET', rk, 'status', 'created_at', 'cgate', 'qu', 'lease_token',
    'resumed', 'cancel_requested', 'error', 'output', 'resolution', 'nosteps', 'attempt',
    'sbytes')
  -- A running run has no finish time (see `apply`).
  return { h[1], h[2], false, false, h[3], false, h[4] }, h[5], h[6], h[7],
    { error = h[8] and #h[8] or 0, output = h[9] and #h[9] or 0,
      resolution = h[10] and #h[10] or 0, finished_at = 0 }, h[11], h[12], h[13], nil
end

-- The common end, stored without the general path's machinery: a plain run (its memo
-- says no gate, the default queue, no resume, no error, output or resolution yet) that
-- succeeds, with at most its first step and no log lines, answered by status. It writes
-- what `finish` would (the same helpers store the step, close and count the execution,
-- charge and index; tests/ends.rs holds the two paths to the same bytes), and
-- skips what the general path spends on the cases it excludes: reading the transition
-- into a table, the memo's nine captures, the lengths and fields tables, `move`'s
-- branches. nil: not such an end (nothing read or written yet), or its cancel was
-- requested — the general path then reads it again.
local PLAIN = '^([^|]*)|||0||||(([^|]*)|.*)$'
local PLAIN_LENS = { error = 0, output = 0, resolution = 0, finished_at = 0 }
local function plain_end(e)
  local rec = e.recs[1]
  if REPLY ~= 'status' or e.wait or e.recs[2] or (rec and (rec.kind ~= 'step'
    or rec.first <= rec.last)) then
    return nil
  end
  -- A success, as an end sends one: 'S', then output, finish time, the execution's fuel,
  -- resolution, executions and fuel counted (read_transition).
  local T = e.t
  if ARGV[T] ~= @SUCCESS@ then return nil end
  local created, open, attempt = string.match(e.memo, PLAIN)
  if not open then return nil end
  local id = e.id
  local rk = runkey(id)
  local h = rcall('HMGET', rk, 'status', 'lease_token', 'cancel_requested', 'nosteps', 'sbytes')
  if not h[1] then return { 'not_found' } end
  if h[1] ~= 'running' or h[2] ~= e.token then return { 'lease_lost' } end
  -- A cancel's reason is stored as the error, and a step of a run with steps may be a
  -- replay: the general path.
  if h[3] == '1' or (rec and h[4] ~= '1') then return nil end
  local out, res, fin = ARGV[T + 1], ARGV[T + 4], ARGV[T + 2]
  local sbase = tonumber(h[5] or '0')
  -- What it adds, checked against the quotas before anything is written (`adding`).
  local n = mem(#out) + mem(#res)
  if rec then n = n + step_cost(id, rec.field, rec.out, true, true) end
  local full = run_full(id, sbase + pending(id, 'sbytes'), n)
  if full then return full end
  -- The run's first step; its `nosteps` is set to '0' with the fields below.
  local fields, k = {}, 0
  if rec then
    write_step(id, rec.field, rec.out, attempt, true, true)
    fields[1], fields[2], k = 'nosteps', '0', 2
  end
  -- The execution closes and counts, as `apply` has it.
  close_attempt(id, '', ARGV[T + 3], '', open)
  count_execution(ARGV[T + 5], ARGV[T + 6])
  -- The run holds no error, finish time or resolution to drop (its memo, and it runs).
  fields[k + 1], fields[k + 2], fields[k + 3], fields[k + 4] = 'output', out, 'finished_at', fin
  fields[k + 5], fields[k + 6], k = 'resolution', res, k + 6
  -- `move` from running to succeeded: out of the leases into its status's index.
  zadd1(stkey('succeeded'), created, id)
  zrem1(KLEASES, id)
  feed_note(id, 'succeeded')
  charge(id, blob_delta(id, fields, PLAIN_LENS))
  local d = RDELTA[id]
  if d and d.sbytes then
    fields[k + 1], fields[k + 2] = 'sbytes', I(sbase + d.sbytes)
    d.sbytes = nil
  end
  rcall('HSET', rk, 'status', 'succeeded', 'updated_at', NOWS, unpack(fields))
  if ENDED then ENDED[#ENDED + 1] = id else wake = wake + resolve_waiters_of(id) end
  return { 'ok', 'succeeded' }
end

local function finish(e)
  local id = e.id
  local rk = runkey(id)
  local pre, token, resumed, cancel, lens, nosteps, attempt, sbytes, open = lease_memo(e, rk)
  if not pre[1] then return { 'not_found' } end
  if pre[1] ~= 'running' or token ~= e.token then return { 'lease_lost' } end
  local t = read_transition(e.t)
  if cancel == '1' and e.cancel then
    t = read_transition(e.cancel)
  elseif resumed == '1' and e.resumed then
    t = read_transition(e.resumed)
  end
  -- Steps and an output over a storage quota are refused before anything changes; the
  -- worker then fails the run (an error is always stored). An output is kept twice, as
  -- the run's output and in the resolution its waiters receive. (The run's bytes come
  -- with the HMGET: a field it asks for costs less than an HGET of its own.)
  local n = adding(e, t, nosteps == '1')
  if n then
    local full = run_full(id, tonumber(sbytes or '0') + pending(id, 'sbytes'), n)
    if full then return full end
  end
  -- The run's first step written here (`adding` found it) leaves its `nosteps` to be
  -- set to '0' with the fields `apply` writes: no HDEL.
  local extra = nil
  for _, r in ipairs(e.recs) do
    if r.kind == 'step' then
      append_logs(id, r.first, r.mrun, r.mten, r.last)
      if not r.old then
        write_step(id, r.field, r.out, attempt, r.first_step, true)
        if r.first_step then extra = { 'nosteps', '0' } end
      end
    elseif r.kind == 'logs' then
      append_logs(id, r.first, r.mrun, r.mten, r.last)
    else
      -- Progress replaces itself (bounded by the sandbox): charged, never refused.
      charge(id, blob_delta(id, { 'progress', r.blob }))
      rcall('HSET', rk, 'progress', r.blob)
    end
  end
  if t.status == 'waiting' then
    if not extra then extra = {} end
    local n = #extra
    extra[n + 1], extra[n + 2] = 'wait', ARGV[e.wait]
    extra[n + 3], extra[n + 4] = 'wait_step', ARGV[e.wait + 1]
  end
  if apply(id, t, pre, extra, lens, tonumber(sbytes or '0'), open) then wake = wake + 1 end
  local status = t.status
  if status == 'waiting' then
    local W = e.wait
    local until_, on, target = ARGV[W + 2], ARGV[W + 3], ARGV[W + 4]
    if until_ ~= '' then zadd_maint(KTIMEOUTS, until_, id) end
    if on == 'event' then
      local ver = rcall('HINCRBY', P .. 'waitver', target, '1')
      charge(id, unpack_cost(id, { 'wait_event', target }))
      rcall('HSET', rk, 'wait_event', target, 'wait_ver', ver)
      rcall('SADD', P .. 'waiters:' .. target, id)
    else
      rcall('HSET', rk, 'wait_run', target)
      rcall('SADD', P .. 'rw:' .. target, id)
      -- A run that already ended resolves the wait at once.
      local r = rcall('HMGET', runkey(target), 'status', 'resolution')
      local res = r[2]
      if not r[1] then res = ARGV[W + 5] end
      if res then
        resolve_wait(id, res)
        wake = wake + 1
        status = 'sleeping'
      end
    end
  end
  if ENDED then ENDED[#ENDED + 1] = id else wake = wake + resolve_waiters_of(id) end
  -- A success stores the output the caller sent: the reply leaves it out.
  if REPLY == 'status' then return { 'ok', status } end
  return { 'ok', run_fields(id, t.hasout == '1') }
end

-- The answers, flat: each its length, then its values (a table per answer cost Redis
-- ~3k instructions to convert; see append_run).
local o, n = 7, 0
for _ = 1, NENDS do
  local e
  e, o = parse(o)
  local a = plain_end(e) or finish(e)
  answers[n + 1] = #a
  for j = 1, #a do answers[n + 1 + j] = a[j] end
  n = n + 1 + #a
end
if ENDED then wake = wake + resolve_waiters_of_all(ENDED) end
local pub = publish(wake, false)
return { 'ok', pub or false, answers }
