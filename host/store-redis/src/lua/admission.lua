-- Admission, after the prelude in the scripts' library: the flow arguments Rust computed
-- for a new run, and `insert_run`, which creates a run (enqueue.lua, send_event.lua).

-- The flow-control arguments of one run, computed by Rust from the function's settings
-- and the run's input (FLOW_ARGS of them, from ARGV[i]).
local function read_flow(i)
  return {
    prio = ARGV[i], offset = ARGV[i + 1], cgate = ARGV[i + 2], climit = ARGV[i + 3],
    tgate = ARGV[i + 4], tlimit = ARGV[i + 5], tperiod = ARGV[i + 6], rgate = ARGV[i + 7],
    rlimit = ARGV[i + 8], rperiod = ARGV[i + 9], dgate = ARGV[i + 10],
    dperiod = ARGV[i + 11], keys = ARGV[i + 12], rerr = ARGV[i + 13], rres = ARGV[i + 14],
    derr = ARGV[i + 15], dprev = ARGV[i + 16], dres = ARGV[i + 17], enforce = ARGV[i + 18],
    dver = ARGV[i + 19], drep = ARGV[i + 20],
  }
end

-- The flows of plain runs (no gate, no flow keys, the default rank), by cap factor: made
-- once, as insert_run only reads a flow.
local PLAIN_FLOWS = {}
local function plain_flow(enforce)
  local fl = PLAIN_FLOWS[enforce]
  if not fl then
    fl = { prio = '0', offset = '0', cgate = '', climit = '', tgate = '', tlimit = '',
      tperiod = '', rgate = '', rlimit = '', rperiod = '', dgate = '', dperiod = '',
      keys = '', rerr = '', rres = '', derr = '', dprev = '', dres = '', enforce = enforce,
      dver = '', drep = '0' }
    PLAIN_FLOWS[enforce] = fl
  end
  return fl
end
-- The flow at ARGV[i] as an enqueue sends it, and where the arguments after it start:
-- FLOW_ARGS arguments, or for a plain run 'p' and its cap factor (PLAIN_FLOW in
-- admission.rs).
local function read_flow_at(i)
  if ARGV[i] ~= @PLAIN_FLOW@ then return read_flow(i), i + FLOW_ARGS end
  return plain_flow(ARGV[i + 1]), i + 2
end

-- Whether the debounce key of `fl`, or the status and attempt of the run it points to,
-- moved since Rust read them (fl.dprev, fl.dver).
local function debounce_moved(fl)
  local prev = rcall('HGET', KDEB, fl.dgate)
  if (prev or '') ~= fl.dprev then return true end
  if not prev then return false end
  local r = rcall('HMGET', runkey(prev), 'status', 'attempt')
  return (r[1] or '') .. '|' .. (r[2] or '') ~= fl.dver
end

-- What a new run costs: the per-run overhead (with its `run:` and `att:` key names),
-- everything its hash keeps whole, its idempotency key, and UNPACK when one of its
-- values keeps its hash from being packed from the start (then also `true`).
local function run_cost(input, trigger, sv, idem, retry, fl, parent, trace)
  local c = C_RUN + 2 * #P + mem(#trigger) + mem(#sv) + mem(#retry) + mem(#fl.keys)
    + mem(#trace)
  if idem ~= '' then c = c + 2 * mem(#idem) + IDEM end
  -- An input over PACKED_MAX bytes is kept in pieces in the hash, or in a key of its own
  -- when longer than CHUNKS pieces (`with_input`); either way the hash stays packed.
  local pieces = pieces_of(#input)
  if pieces then
    c = c + #input + C_PIECE * pieces
  else
    c = c + mem(#input) + C_IN + #P
  end
  local M = PACKED_MAX
  if #trigger > M or #idem > M or #retry > M or #fl.keys > M or #fl.cgate > M
      or #fl.tgate > M or #fl.dgate > M or #parent > M or #trace > M then
    return c + UNPACK, true
  end
  return c, false
end

-- Creates a run of function `fname`, or returns the run created earlier with the same
-- idempotency key within the window. `trace`: its W3C traceparent or ''. `sv` is the
-- version of the function's settings Rust computed `fl` from: the run pins that version (`sets`), not a copy of the blob.
-- Applies the rate limit (the run is created skipped), debounce (the pending run of the
-- key is skipped), the tenant's max_queued (when fl.enforce) and its storage quotas. Returns id, created, error ('not_found', 'stale', 'quota', or a
-- 'storage' reply), runs woken, and for a created run what Rust cannot know of it:
-- { status, due_at, digest, max_attempts, sbytes }.
local function insert_run(id, fname, input, trigger, due, idem, retry, retry_max, parent, trace, sv, fl)
  -- Runs sent together are mostly of one function: read once per call (FNS).
  local f = FNS and FNS[fname]
  if not f then
    local fk = P .. 'fn:' .. fname
    f = rcall('HMGET', fk, 'digest', 'sv', 'max_attempts', 'queue', 'svd')
    if f[1] and not f[5] then f[2] = settings_version(fk) end
    if FNS then FNS[fname] = f end
  end
  if not f[1] then return nil, false, 'not_found', 0 end
  if f[2] ~= sv then return nil, false, 'stale', 0 end
  local ik = P .. 'idem:' .. fname
  if idem ~= '' then
    local v = rcall('HGET', ik, idem)
    if v then
      local sep = string.find(v, ':', 1, true)
      local created, old = tonumber(string.sub(v, 1, sep - 1)), string.sub(v, sep + 1)
      local exists = rcall('EXISTS', runkey(old)) == 1
      if exists and created > NOW - WINDOW then return old, false, nil, 0 end
      -- Past its window the key is free again; the old run keeps its history.
      if exists then rcall('HDEL', runkey(old), 'idempotency_key') end
    end
  end
  local status = 'queued'
  if fl.rgate ~= '' and window_full(fl.rgate, tonumber(fl.rlimit), tonumber(fl.rperiod)) then
    status = 'skipped'
  end
  local replaced = nil
  if status == 'queued' and fl.dgate ~= '' then
    -- Rust read the run the key points to, decided whether this run replaces it
    -- (wasq_core::lifecycle::debounce_replaces) and computed its resolution.
    if debounce_moved(fl) then return nil, false, 'stale', 0 end
    if fl.dprev ~= '' and fl.drep == '1' then replaced = fl.dprev end
  end
  -- fl.enforce: how many times the tenant's max_queued the queue may hold
  -- (wasq_core::lifecycle::Admission::cap_factor); '0' none (checked by the caller).
  if status == 'queued' and fl.enforce ~= '0' then
    local maxq = quota('max_queued')
    local adding = 1
    if replaced then adding = 0 end
    if maxq and queued_count() + adding > maxq * tonumber(fl.enforce) then
      return nil, false, 'quota', 0
    end
  end
  local cost, unpacked = run_cost(input, trigger, sv, idem, retry, fl, parent, trace)
  if status == 'skipped' then
    cost = cost + mem(#fl.rerr) + mem(#fl.rres)
    if not unpacked and (#fl.rerr > PACKED_MAX or #fl.rres > PACKED_MAX) then
      cost, unpacked = cost + UNPACK, true
    end
  end
  -- A run of a named queue keeps the name (`qu`, at most 64 bytes: packed).
  if f[4] then cost = cost + mem(#f[4]) end
  local full = run_full(id, 0, cost)
  if full then return nil, false, full, 0 end
  if idem ~= '' then rcall('HSET', ik, idem, NOWS .. ':' .. id) end
  local woke = 0
  if replaced then
    move(replaced, 'skipped', { 'error', fl.derr, 'finished_at', NOWS, 'resolution', fl.dres })
    woke = resolve_waiters_of(replaced)
  end
  if due == '' then due = NOWS end
  if status == 'skipped' then due = NOWS end
  if status == 'queued' and fl.dgate ~= '' then
    if tonumber(due) < NOW + tonumber(fl.dperiod) then due = I(NOW + tonumber(fl.dperiod)) end
    rcall('HSET', KDEB, fl.dgate, id)
  end
  local max = f[3]
  if retry ~= '' then max = retry_max end
  -- A packed hash finds a field by scanning from its start: the fields every claim and
  -- finish read or write come first.
  -- Fields at their default are left out (every reader knows it): attempt, lease_token,
  -- resumed and cancel_requested '0', rank_offset and priority '0', trigger 'api',
  -- updated_at until the first transition sets it (created_at); so are the id and the
  -- tenant, which the key names. Each field costs every command that reads or writes the
  -- hash.
  local now, costs = NOWS, I(cost)
  local fields = {
    'status', status, 'sbytes', costs, 'created_at', now,
    'nosteps', '1', 'due_at', due, 'function', fname, 'sv', sv, 'max_attempts', max,
  }
  local function add(k, v) if v ~= '' then fields[#fields + 1] = k; fields[#fields + 1] = v end end
  if trigger ~= 'api' then add('trigger', trigger) end
  if fl.offset ~= '0' then add('rank_offset', fl.offset) end
  if fl.prio ~= '0' then add('priority', fl.prio) end
  if #input <= PACKED_MAX then
    fields[#fields + 1] = 'input'
    fields[#fields + 1] = input
  end
  add('retry', retry)
  add('idempotency_key', idem)
  add('parent', parent)
  add('trace', trace)
  add('keys', fl.keys)
  add('cgate', fl.cgate)
  if fl.cgate ~= '' then add('climit', fl.climit) end
  add('tgate', fl.tgate)
  if fl.tgate ~= '' then add('tlimit', fl.tlimit); add('tperiod', fl.tperiod) end
  if status == 'queued' then add('dgate', fl.dgate) end
  if status == 'skipped' then
    add('error', fl.rerr)
    add('finished_at', NOWS)
    add('resolution', fl.rres)
  end
  -- The queue of the function's settings (deploy.lua keeps it beside them; absent: the
  -- default queue), pinned like them.
  local queue = f[4] or nil
  if queue then
    add('qu', queue)
    queue_load(queue, status, 1)
  end
  if unpacked then add('up', '1') end
  -- A longer input last: a scan for any other field stops before it.
  if #input > PACKED_MAX and not input_pieces(input, fields) then
    rcall('SET', inkey(id), input)
  end
  if parent ~= '' then zadd1(P .. 'kids:' .. parent, NOWS, id) end
  rcall('HSET', runkey(id), unpack(fields))
  feed_note(id, status)
  charge(nil, cost)
  -- The component stays while a run pins it (see collect_components in lib.rs).
  -- (Counted in PINS, written by `leave`, while writes are deferred.)
  local pinned = pin(nil, sv)
  if PINS then
    PINS[pinned] = (PINS[pinned] or 0) + 1
  else
    rcall('HINCRBY', KRDIG, pinned, '1')
  end
  reindex(id, fname, nil, status, NOWS)
  if status ~= 'skipped' then
    if tonumber(due) <= NOW then
      local rank = due
      if fl.offset ~= '0' then rank = I(tonumber(due) + tonumber(fl.offset)) end
      lane_add(queue, rank, id)
    else
      zadd_maint(KREADY, due, id)
    end
    if fl.rgate ~= '' then window_log(fl.rgate, tonumber(fl.rlimit)) end
  end
  return id, true, nil, woke, { status, due, f[1], max, costs }
end
