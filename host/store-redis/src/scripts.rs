//! The Lua scripts: one per state transition, each over the keys of one tenant (and, on a
//! single node only, the global schedule keys; see `publish`).
//!
//! Every tenant script starts with [`PRELUDE`], which reads the common arguments
//! (`ARGV[1..4]`: tenant key prefix, global prefix or `""`, now, tenant) and defines the
//! helpers that keep a run's hash and every index in step. Script-specific arguments start
//! at `ARGV[5]`.
//!
//! Rules the scripts follow:
//! - Time is `ARGV[3]`, from the store's injected clock; never Redis `TIME`.
//! - Numbers Lua computes are written with `I()` (`%d`), so a millisecond timestamp never
//!   turns into `1.7e+12`; numbers Lua only copies stay the strings Rust sent.
//! - Blobs (input, output, settings, error, wait, resolutions, log lines) are opaque: Lua
//!   copies them and never round-trips them through cjson; no script builds JSON or a
//!   message (cjson only decodes the event-name list of a function).
//! - Lua decides nothing about a run's life: what a finish, a lost lease, a cancel or a
//!   retry does is a transition computed by `wasq_core::lifecycle` and passed in
//!   (`read_transition`, `apply`); where the script alone knows the case (a run resumed,
//!   its cancel requested) Rust sends a transition per case and the script picks. Scripts
//!   check leases and versions (a status read before, a debounce key's run) and answer
//!   `stale` when they moved.
//! - Replies are arrays whose first element is a status word; `false` stands for "none".

use std::sync::LazyLock;

use redis::Script;
use wasq_core::IDEMPOTENCY_WINDOW_MS;

use crate::decode::RUN_FIELDS;

/// Most index entries one claim reaps or times out per tenant, so a script stays short;
/// the rest are taken by the next claim (the tenant stays due).
pub(crate) const REAP_BATCH: usize = 200;
/// Wake-up tokens kept in the wake list.
pub(crate) const WAKE_LIST_MAX: usize = 64;
/// Flow-control arguments per run (`read_flow` in the prelude; `flow_args` in lib.rs).
pub(crate) const FLOW_ARGS: usize = 19;
/// Due runs one claim moves into the lane at most.
pub(crate) const PROMOTE_BATCH: usize = 1000;
/// Gate checks one claim may fail (parking those runs) before it stops for now.
pub(crate) const PARK_BUDGET: usize = 1000;

const PRELUDE: &str = r#"
local P = ARGV[1]
local G = ARGV[2]
local NOW = tonumber(ARGV[3])
local TENANT = ARGV[4]
local WINDOW = @WINDOW@
local WAKEMAX = @WAKEMAX@
local FLOW_ARGS = @FLOW_ARGS@
local T_ARGS = @T_ARGS@

local function I(n) return string.format('%d', n) end
local function runkey(id) return P .. 'run:' .. id end

-- Storage accounting (wasq_core::storage): what each record costs besides the bytes
-- stored whole (their length), from RedisStore's cost model; the quotas are the copies
-- in `quotas` (none: unlimited). A run keeps its own bytes in `sbytes` and `lbytes`.
-- KEY: a key of the run's own (its `logs:`, `steps:`, `stepseq:`), charged when the
-- run's first line or step creates it. Key names count at their length (the tenant's
-- prefix P varies); the constants are net of it.
local C_RUN, C_ATT, C_STEP, C_LOG, C_EVENT, C_FN = @COSTS@
local KEY = @KEY_COST@ + #P
-- IDEM: an idempotency key's overhead besides the key itself (twice): the run's
-- `idempotency_key` field and the entry in `idem:<function>` with its `created_at:id`.
local IDEM = 130
-- What a value of n bytes stored on its own (a hash field of a run, a component) really
-- takes: its sds header and terminator, rounded up to jemalloc's size class (16-byte
-- steps up to 128, then four classes per doubling), as MEMORY USAGE counts it. Values of
-- 64 bytes or less count as they are: Redis packs them, or their rounding is in the
-- per-record constants.
local function mem(n)
  if n <= 64 then return n end
  local need = n + 4
  if n >= 65536 then need = n + 10 elseif n >= 256 then need = n + 6 end
  if need <= 128 then return math.ceil(need / 16) * 16 end
  local p = 128
  while p * 2 < need do p = p * 2 end
  local class = p / 4
  return math.ceil(need / class) * class
end
local INLINE = @INLINE@
local function quota(name)
  local q = redis.call('HGET', P .. 'quotas', name)
  if q then return tonumber(q) end
  return nil
end
local function stored() return tonumber(redis.call('HGET', P .. 'usage', 'stored') or '0') end
-- Adds n bytes to the tenant's usage and, with an id, to the run's `field` (sbytes).
local function charge(id, n, field)
  if n == 0 then return end
  redis.call('HINCRBY', P .. 'usage', 'stored', n)
  if id then redis.call('HINCRBY', runkey(id), field or 'sbytes', n) end
end
-- nil when the tenant has room for n more bytes, else the reply refusing them.
local function tenant_full(n)
  local max = quota('max_stored_bytes')
  local used = stored()
  if max and used + n > max then return { 'storage', 'tenant', I(used), I(n), I(max) } end
  return nil
end
-- nil when run `id` (used: its bytes so far) and its tenant have room for n more bytes.
local function run_full(id, used, n)
  local max = quota('max_run_bytes')
  if max and used + n > max then return { 'storage', 'run', I(used), I(n), I(max) } end
  return tenant_full(n)
end
local function run_bytes(id) return tonumber(redis.call('HGET', runkey(id), 'sbytes') or '0') end
-- The run's fields that come and go (its latest error, output, the resolution its waiters
-- receive, its wait, its progress): charged at their size when set (`move`,
-- `blob_delta`), the old value given back; dropped with `drop_blobs`.
local BLOBS = { error = true, output = true, resolution = true, wait = true, progress = true }
local function blob_delta(rk, fields)
  local d = 0
  for i = 1, #fields, 2 do
    if BLOBS[fields[i]] then
      d = d + mem(#fields[i + 1]) - mem(redis.call('HSTRLEN', rk, fields[i]))
    end
  end
  return d
end
local function drop_blobs(id, ...)
  local rk = runkey(id)
  local d = 0
  for _, f in ipairs({ ... }) do
    if BLOBS[f] then d = d - mem(redis.call('HSTRLEN', rk, f)) end
  end
  charge(id, d)
  redis.call('HDEL', rk, ...)
end

-- An event id is kept twice (the dedup hash and its time index).
local function event_cost(eid) return C_EVENT + 2 * #eid end
-- Forgets up to `limit` event ids past their dedup window, giving back what they cost.
local function forget_events(limit)
  for _, old in ipairs(redis.call('ZRANGEBYSCORE', P .. 'evz', '-inf', NOW - WINDOW, 'LIMIT', 0, limit)) do
    redis.call('ZREM', P .. 'evz', old)
    redis.call('HDEL', P .. 'events', old)
    charge(nil, -event_cost(old))
  end
end
local TERMINAL = { succeeded = true, failed = true, cancelled = true, skipped = true }

-- A run as replies carry it: the values of RUN_FIELDS (decode.rs), in order. Without its
-- last field, output, when the caller already has it.
local RUN_FIELDS = { @RUN_FIELDS@ }
local function run_fields(id, without_output)
  local n = #RUN_FIELDS
  if without_output then n = n - 1 end
  return redis.call('HMGET', runkey(id), unpack(RUN_FIELDS, 1, n))
end

-- A claimed run and its steps. `nosteps`: the run's `nosteps` flag (set at creation,
-- cleared by its first step), so a run without steps costs no reads of its step keys.
-- Step outputs come along while they fit in INLINE bytes; the rest by reference.
local function load_run(id, nosteps)
  if nosteps then return { run_fields(id), {}, {} } end
  local sk = P .. 'steps:' .. id
  local order = redis.call('LRANGE', P .. 'stepseq:' .. id, 0, -1)
  local outs, budget = {}, INLINE
  for _, e in ipairs(order) do
    local field = string.match(e, '^[^|]*|[^|]*|(.*)$')
    local len = redis.call('HSTRLEN', sk, field)
    if len <= budget then
      budget = budget - len
      outs[#outs + 1] = field
      outs[#outs + 1] = redis.call('HGET', sk, field)
    end
  end
  return { run_fields(id), order, outs }
end

-- Flow control (see lib.rs): due runs wait in the lane `q` by rank; a run its gate holds
-- back is parked in `park:<gate>` (same rank) until the gate lets it back into the lane.
local function unpark(id, score)
  redis.call('ZADD', P .. 'q', score, id)
  redis.call('HDEL', runkey(id), 'parked')
end

local function park(id, gate, score)
  redis.call('ZREM', P .. 'q', id)
  redis.call('ZADD', P .. 'park:' .. gate, score, id)
  redis.call('HSET', runkey(id), 'parked', gate)
end

-- A slot of a concurrency key freed: its best parked run goes back into the lane.
local function unpark_one(gate)
  local p = redis.call('ZPOPMIN', P .. 'park:' .. gate, 1)
  if p[1] then unpark(p[1], p[2]) end
end

-- The value of field `name` in a flat name/value list, or the run's stored value.
local function field_or_stored(fields, name, rk)
  for i = 1, #fields, 2 do
    if fields[i] == name then return fields[i + 1] end
  end
  return redis.call('HGET', rk, name)
end

-- The fields `move` reads first, in this order; a caller that read them already (the
-- first MOVE_FIELDS elements of its HMGET) passes them as `pre`.
local MOVE_FIELDS = { 'status', 'created_at', 'wait_event', 'wait_run', 'cgate', 'parked' }

-- Moves run `id` to `status`, setting `fields` (flat name/value list) and updated_at, and
-- keeps every index in step: status index, ready/lane/park/lease/timeout zsets, waiter
-- sets, ended zsets, running sets of concurrency keys. Waiting runs get their waiter-set
-- and timeout entries from the caller. A run is only taken out of the indexes its old
-- status puts it in: queued and sleeping runs are in `ready` or `q` (or parked), running
-- runs in `leases`, waiting runs in `timeouts` and their waiter set; entries an index
-- keeps after a run left its status are dropped by the claim that meets them.
local function move(id, status, fields, pre)
  local rk = runkey(id)
  local r = pre or redis.call('HMGET', rk, unpack(MOVE_FIELDS))
  local old, created, cgate = r[1], r[2], r[5]
  if old ~= status then
    if old then redis.call('ZREM', P .. 'st:' .. old, id) end
    redis.call('ZADD', P .. 'st:' .. status, created, id)
  end
  if old == 'queued' or old == 'sleeping' then
    redis.call('ZREM', P .. 'ready', id)
    redis.call('ZREM', P .. 'q', id)
  elseif old == 'running' then
    redis.call('ZREM', P .. 'leases', id)
  elseif old == 'waiting' then
    redis.call('ZREM', P .. 'timeouts', id)
    if r[3] then redis.call('SREM', P .. 'waiters:' .. r[3], id) end
    if r[4] then redis.call('SREM', P .. 'rw:' .. r[4], id) end
  elseif old == 'succeeded' or old == 'skipped' then
    redis.call('ZREM', P .. 'ended:ok', id)
  elseif old == 'failed' or old == 'cancelled' then
    redis.call('ZREM', P .. 'ended:bad', id)
  end
  if r[6] then
    redis.call('ZREM', P .. 'park:' .. r[6], id)
    redis.call('HDEL', rk, 'parked')
  end
  charge(id, blob_delta(rk, fields))
  redis.call('HSET', rk, 'status', status, 'updated_at', I(NOW), unpack(fields))
  if status == 'queued' or status == 'sleeping' then
    local h = redis.call('HMGET', rk, 'due_at', 'rank_offset')
    local due = tonumber(h[1])
    if due <= NOW then
      redis.call('ZADD', P .. 'q', I(due + tonumber(h[2] or '0')), id)
    else
      redis.call('ZADD', P .. 'ready', h[1], id)
    end
  elseif status == 'running' then
    redis.call('ZADD', P .. 'leases', field_or_stored(fields, 'lease_expires_at', rk), id)
  elseif status == 'succeeded' or status == 'skipped' then
    redis.call('ZADD', P .. 'ended:ok', field_or_stored(fields, 'finished_at', rk), id)
  elseif status == 'failed' or status == 'cancelled' then
    redis.call('ZADD', P .. 'ended:bad', field_or_stored(fields, 'finished_at', rk), id)
  end
  if cgate and old ~= status then
    if status == 'running' then
      redis.call('SADD', P .. 'crun:' .. cgate, id)
    elseif old == 'running' then
      redis.call('SREM', P .. 'crun:' .. cgate, id)
      unpark_one(cgate)
    elseif TERMINAL[status] and not r[6] then
      -- A candidate for a slot is gone: let the next one try.
      unpark_one(cgate)
    end
  end
end

-- Ends the run's latest execution (the last element of its attempts list).
local function close_attempt(id, err, fuel, suspended)
  local ak = P .. 'att:' .. id
  local last = redis.call('LINDEX', ak, -1)
  if last then
    last = string.match(last, '^[^\n]*')
    redis.call('LSET', ak, -1, last .. '\n' .. I(NOW) .. '|' .. fuel .. '|' .. suspended .. '|' .. err)
    -- Never refused: a run over its quota must still be able to fail.
    charge(id, #err)
  end
end

-- What a new step costs: its field twice (the hash and the order list) and its output;
-- the run's first step creates both keys.
local function step_cost(id, field, output)
  local c = C_STEP + 2 * #field + mem(#output)
  if redis.call('HEXISTS', runkey(id), 'nosteps') == 1 then c = c + 2 * KEY end
  return c
end

-- Stores a step output; the first write wins.
local function write_step(id, field, output, attempt)
  local sk = P .. 'steps:' .. id
  if redis.call('HEXISTS', sk, field) == 0 then
    charge(id, step_cost(id, field, output))
    redis.call('HSET', sk, field, output)
    redis.call('RPUSH', P .. 'stepseq:' .. id, attempt .. '|' .. I(NOW) .. '|' .. field)
    redis.call('HDEL', runkey(id), 'nosteps')
  end
end

-- Appends log lines (ARGV[first..]) while the run's log budget (max_run_log_bytes) and
-- the tenant's room last; past either, the marker line Rust made for that case, once,
-- and nothing after it (`lcut`).
local function append_logs(id, first, mrun, mtenant)
  if first > #ARGV then return end
  local rk = runkey(id)
  local r = redis.call('HMGET', rk, 'lbytes', 'lcut')
  if r[2] == '1' then return end
  local used = tonumber(r[1] or '0')
  local rmax, tmax = quota('max_run_log_bytes'), quota('max_stored_bytes')
  local tused = stored()
  local added, cut = 0, nil
  -- The run's first line creates its list.
  local key = 0
  if redis.call('EXISTS', P .. 'logs:' .. id) == 0 then key = KEY end
  for i = first, #ARGV do
    local c = C_LOG + #ARGV[i] + key
    if rmax and used + added + c > rmax then cut = mrun
    elseif tmax and tused + added + c > tmax then cut = mtenant end
    if cut then break end
    redis.call('RPUSH', P .. 'logs:' .. id, ARGV[i])
    added = added + c
    key = 0
  end
  if cut then
    redis.call('RPUSH', P .. 'logs:' .. id, cut)
    redis.call('HSET', rk, 'lcut', '1')
    added = added + C_LOG + #cut + key
  end
  charge(id, added, 'lbytes')
end

-- Ends a wait: the resolution becomes the waiting step's output and the run is due now as
-- a resume of its current attempt.
local function resolve_wait(id, resolution)
  local rk = runkey(id)
  local r = redis.call('HMGET', rk, 'wait_step', 'attempt')
  write_step(id, r[1], resolution, r[2])
  move(id, 'sleeping', { 'due_at', I(NOW) })
  drop_blobs(id, 'wait', 'wait_event', 'wait_run', 'wait_step', 'wait_ver')
end

-- After run `id` ended: the runs waiting for it resume with its resolution. Returns how
-- many resumed.
local function resolve_waiters_of(id)
  local wk = P .. 'rw:' .. id
  local ws = redis.call('SMEMBERS', wk)
  if #ws == 0 then return 0 end
  local res = redis.call('HGET', runkey(id), 'resolution')
  if not res then return 0 end
  local n = 0
  for _, w in ipairs(ws) do
    local r = redis.call('HMGET', runkey(w), 'status', 'wait_run')
    if r[1] == 'waiting' and r[2] == id then
      resolve_wait(w, res)
      n = n + 1
    end
  end
  redis.call('DEL', wk)
  return n
end

-- A transition computed by wasq_core::lifecycle (T_ARGS arguments from ARGV[i], see
-- transition.rs); nil when ARGV[i] is '' (none sent).
local function read_transition(i)
  if ARGV[i] == '' then return nil end
  local a = function(k) return ARGV[i + k] end
  return {
    status = a(0), errmode = a(1), err = a(2), hasout = a(3), out = a(4), due = a(5),
    fin = a(6), giveback = a(7), exec = a(8), eerr = a(9), efuel = a(10), esusp = a(11),
    res = a(12), uexec = a(13), ufuel = a(14), clearcancel = a(15),
  }
end

-- Writes transition `t` of run `id`: its history, its tenant's usage, its hash and every
-- index (`move`, which takes `pre` and `extra` fields). It decides nothing: whatever the
-- transition says is stored. Returns whether the run is now claimable at once.
local function apply(id, t, pre, extra)
  local rk = runkey(id)
  if t.exec == 'close' then
    close_attempt(id, t.eerr, t.efuel, t.esusp)
  elseif t.exec == 'drop' then
    local att = redis.call('RPOP', P .. 'att:' .. id)
    if att then
      local worker = string.match(att, '^[^|]*|[^|]*|(.*)$') or ''
      charge(id, -(C_ATT + #worker))
    end
  end
  if t.uexec == '1' then
    redis.call('HINCRBY', P .. 'usage', 'attempts', 1)
    if t.ufuel ~= '' then redis.call('HINCRBY', P .. 'usage', 'fuel', t.ufuel) end
  end
  local fields, gone = extra or {}, { 'lease_expires_at', 'worker' }
  local function set(k, v) fields[#fields + 1] = k; fields[#fields + 1] = v end
  if t.errmode == 's' then set('error', t.err) elseif t.errmode == 'c' then gone[#gone + 1] = 'error' end
  if t.hasout == '1' then set('output', t.out) end
  if t.due ~= '' then set('due_at', t.due) end
  if t.fin ~= '' then set('finished_at', t.fin) else gone[#gone + 1] = 'finished_at' end
  if t.res ~= '' then set('resolution', t.res) else gone[#gone + 1] = 'resolution' end
  if t.clearcancel == '1' then set('cancel_requested', '0') end
  if t.giveback == '1' then
    set('attempt', I(tonumber(redis.call('HGET', rk, 'attempt')) - 1))
  end
  move(id, t.status, fields, pre)
  drop_blobs(id, unpack(gone))
  return (t.status == 'queued' or t.status == 'sleeping')
    and tonumber(redis.call('HGET', rk, 'due_at')) <= NOW
end

-- The sliding window of a throttle or rate limit (`win:<gate>`, newest first, at most
-- `limit` entries): the time it opens when `limit` entries fall in the last `period`,
-- nil when there is room.
local function window_full(gate, limit, period)
  local t = redis.call('LINDEX', P .. 'win:' .. gate, limit - 1)
  if t and tonumber(t) > NOW - period then return tonumber(t) + period end
  return nil
end

local function window_log(gate, limit)
  redis.call('LPUSH', P .. 'win:' .. gate, I(NOW))
  redis.call('LTRIM', P .. 'win:' .. gate, 0, limit - 1)
end

-- The flow-control arguments of one run, computed by Rust from the function's settings
-- and the run's input (FLOW_ARGS of them, from ARGV[i]).
local function read_flow(i)
  local a = function(k) return ARGV[i + k] end
  return {
    prio = a(0), offset = a(1), cgate = a(2), climit = a(3), tgate = a(4), tlimit = a(5),
    tperiod = a(6), rgate = a(7), rlimit = a(8), rperiod = a(9), dgate = a(10),
    dperiod = a(11), keys = a(12), rerr = a(13), rres = a(14), derr = a(15), dprev = a(16),
    dres = a(17), enforce = a(18),
  }
end

-- What a new run costs: the per-run overhead (with its `run:` and `att:` key names),
-- everything its hash keeps whole, and its idempotency key.
local function run_cost(input, trigger, settings, idem, retry, fl)
  local c = C_RUN + 2 * #P + mem(#input) + mem(#trigger) + mem(#settings) + mem(#retry)
    + mem(#fl.keys)
  if idem ~= '' then c = c + 2 * mem(#idem) + IDEM end
  return c
end

-- Creates a run of function `fname`, or returns the run created earlier with the same
-- idempotency key within the window. `settings` is the function's settings blob Rust
-- computed `fl` from. Applies the rate limit (the run is created skipped), debounce (the
-- pending run of the key is skipped), the tenant's max_queued (when fl.enforce) and its
-- storage quotas. Returns id, created, error ('not_found', 'stale', 'quota', or a
-- 'storage' reply), runs woken.
local function insert_run(id, fname, input, trigger, due, idem, retry, retry_max, parent, settings, fl)
  local f = redis.call('HMGET', P .. 'fn:' .. fname, 'digest', 'settings', 'max_attempts')
  if not f[1] then return nil, false, 'not_found', 0 end
  if f[2] ~= settings then return nil, false, 'stale', 0 end
  local ik = P .. 'idem:' .. fname
  if idem ~= '' then
    local v = redis.call('HGET', ik, idem)
    if v then
      local sep = string.find(v, ':', 1, true)
      local created, old = tonumber(string.sub(v, 1, sep - 1)), string.sub(v, sep + 1)
      local exists = redis.call('EXISTS', runkey(old)) == 1
      if exists and created > NOW - WINDOW then return old, false, nil, 0 end
      -- Past its window the key is free again; the old run keeps its history.
      if exists then redis.call('HDEL', runkey(old), 'idempotency_key') end
    end
  end
  local status = 'queued'
  if fl.rgate ~= '' and window_full(fl.rgate, tonumber(fl.rlimit), tonumber(fl.rperiod)) then
    status = 'skipped'
  end
  local replaced = nil
  if status == 'queued' and fl.dgate ~= '' then
    -- Rust computed the replaced run's resolution for the run the key pointed to.
    local prev = redis.call('HGET', P .. 'deb', fl.dgate)
    if (prev or '') ~= fl.dprev then return nil, false, 'stale', 0 end
    if prev then
      local r = redis.call('HMGET', runkey(prev), 'status', 'attempt')
      if r[1] == 'queued' and r[2] == '0' then replaced = prev end
    end
  end
  -- fl.enforce: how many times the tenant's max_queued the queue may hold
  -- (wasq_core::lifecycle::Admission::cap_factor); '0' none (checked by the caller).
  if status == 'queued' and fl.enforce ~= '0' then
    local maxq = redis.call('HGET', P .. 'quotas', 'max_queued')
    local adding = 1
    if replaced then adding = 0 end
    if maxq and redis.call('ZCARD', P .. 'st:queued') + adding > tonumber(maxq) * tonumber(fl.enforce) then
      return nil, false, 'quota', 0
    end
  end
  local cost = run_cost(input, trigger, f[2], idem, retry, fl)
  if status == 'skipped' then cost = cost + mem(#fl.rerr) + mem(#fl.rres) end
  local full = run_full(id, 0, cost)
  if full then return nil, false, full, 0 end
  if idem ~= '' then redis.call('HSET', ik, idem, I(NOW) .. ':' .. id) end
  local woke = 0
  if replaced then
    move(replaced, 'skipped', { 'error', fl.derr, 'finished_at', I(NOW), 'resolution', fl.dres })
    woke = resolve_waiters_of(replaced)
  end
  if due == '' then due = I(NOW) end
  if status == 'skipped' then due = I(NOW) end
  if status == 'queued' and fl.dgate ~= '' then
    if tonumber(due) < NOW + tonumber(fl.dperiod) then due = I(NOW + tonumber(fl.dperiod)) end
    redis.call('HSET', P .. 'deb', fl.dgate, id)
  end
  local max = f[3]
  if retry ~= '' then max = retry_max end
  local fields = {
    'id', id, 'tenant', TENANT, 'function', fname, 'digest', f[1], 'settings', f[2],
    'max_attempts', max, 'status', status, 'input', input, 'attempt', '0',
    'trigger', trigger, 'created_at', I(NOW), 'updated_at', I(NOW), 'due_at', due,
    'lease_token', '0', 'cancel_requested', '0', 'resumed', '0', 'nosteps', '1',
    'priority', fl.prio, 'rank_offset', fl.offset,
  }
  local function add(k, v) if v ~= '' then fields[#fields + 1] = k; fields[#fields + 1] = v end end
  add('retry', retry)
  add('idempotency_key', idem)
  add('parent', parent)
  add('keys', fl.keys)
  add('cgate', fl.cgate)
  if fl.cgate ~= '' then add('climit', fl.climit) end
  add('tgate', fl.tgate)
  if fl.tgate ~= '' then add('tlimit', fl.tlimit); add('tperiod', fl.tperiod) end
  if status == 'queued' then add('dgate', fl.dgate) end
  if status == 'skipped' then
    add('error', fl.rerr)
    add('finished_at', I(NOW))
    add('resolution', fl.rres)
  end
  add('sbytes', I(cost))
  if parent ~= '' then redis.call('ZADD', P .. 'kids:' .. parent, NOW, id) end
  redis.call('HSET', runkey(id), unpack(fields))
  charge(nil, cost)
  -- The component stays while a run pins it (see collect_components in lib.rs).
  redis.call('HINCRBY', P .. 'rdig', f[1], 1)
  redis.call('ZADD', P .. 'all', NOW, id)
  redis.call('ZADD', P .. 'byfn:' .. fname, NOW, id)
  redis.call('ZADD', P .. 'st:' .. status, NOW, id)
  if status == 'skipped' then
    redis.call('ZADD', P .. 'ended:ok', NOW, id)
  else
    if tonumber(due) <= NOW then
      redis.call('ZADD', P .. 'q', I(tonumber(due) + tonumber(fl.offset)), id)
    else
      redis.call('ZADD', P .. 'ready', due, id)
    end
    if fl.rgate ~= '' then window_log(fl.rgate, tonumber(fl.rlimit)) end
  end
  return id, true, nil, woke
end

-- Whether the tenant may start another run (its max_running quota).
local function has_room()
  local maxr = redis.call('HGET', P .. 'quotas', 'max_running')
  return not maxr or redis.call('ZCARD', P .. 'leases') < tonumber(maxr)
end

-- The tenant's next due time: 0 (now) when its lane holds runs it has room to start,
-- else the earliest of its not yet due runs, lease expiries, wait timeouts and throttle
-- windows opening; nil when it has none. Parked runs wait for an event of their gate.
local function next_due()
  if redis.call('ZCARD', P .. 'q') > 0 and has_room() then return 0 end
  local best = nil
  for _, z in ipairs({ 'ready', 'leases', 'timeouts', 'gtimer' }) do
    local h = redis.call('ZRANGE', P .. z, 0, 0, 'WITHSCORES')
    if h[2] then
      local s = tonumber(h[2])
      if best == nil or s < best then best = s end
    end
  end
  return best
end

@APPLY_HINT@

-- Publishes the tenant's next due time to the global schedule and pushes `wake` tokens.
-- Single node (G set): done here, atomically. Cluster (G empty): the global keys live in
-- another slot, so the script returns {seq, next, wake} and the caller applies it with the
-- hint script, which drops updates older than the newest seq it has seen.
local function publish(wake, force)
  local n = next_due()
  local ns = ''
  if n then ns = I(n) end
  local meta = P .. 'meta'
  local changed = force or redis.call('HGET', meta, 'next') ~= ns
  if not changed and wake == 0 then return false end
  local seq = 0
  if changed then
    seq = redis.call('HINCRBY', meta, 'seq', 1)
    redis.call('HSET', meta, 'next', ns)
  end
  if G ~= '' then
    apply_hint(G, TENANT, ns, wake, changed)
    return false
  end
  return { seq, ns, wake }
end

local function check_lease(id, token)
  local r = redis.call('HMGET', runkey(id), 'status', 'lease_token')
  if not r[1] then return 'not_found' end
  if r[1] ~= 'running' or r[2] ~= token then return 'lease_lost' end
  return nil
end
"#;

/// Shared by [`PRELUDE`] (single node) and [`HINT`] (cluster).
const APPLY_HINT: &str = r#"
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
"#;

fn tenant_script(body: &str) -> Script {
    let c = crate::COST;
    let costs = format!(
        "{}, {}, {}, {}, {}, {}",
        c.run, c.attempt, c.step, c.log_line, c.event, c.function
    );
    let src = format!("{PRELUDE}\n{body}")
        .replace("@COSTS@", &costs)
        .replace("@KEY_COST@", &crate::KEY_COST.to_string())
        .replace(
            "@INLINE@",
            &wasq_core::storage::INLINE_REPLAY_BYTES.to_string(),
        )
        .replace("@APPLY_HINT@", APPLY_HINT)
        .replace("@WINDOW@", &IDEMPOTENCY_WINDOW_MS.to_string())
        .replace("@T_ARGS@", &crate::transition::T_ARGS.to_string())
        .replace(
            "@TIMED_OUT@",
            &lua_bytes(&wasq_core::Resolution::TimedOut.to_bytes()),
        )
        .replace("@WAKEMAX@", &WAKE_LIST_MAX.to_string())
        .replace("@FLOW_ARGS@", &FLOW_ARGS.to_string())
        .replace("@RUN_FIELDS@", &lua_strings(RUN_FIELDS));
    Script::new(&src)
}

/// A Lua string literal of `bytes` (every byte escaped: no quoting rules to get wrong).
fn lua_bytes(bytes: &[u8]) -> String {
    let mut out = String::from("'");
    for b in bytes {
        out.push_str(&format!("\\{b:03}"));
    }
    out.push('\'');
    out
}

/// `'a', 'b', ...`: a Lua table's elements.
fn lua_strings(items: &[&str]) -> String {
    items
        .iter()
        .map(|i| format!("'{i}'"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Cluster only: applies a tenant's published next due time to the global schedule.
/// KEYS[1] = G..'due'; ARGV: G, tenant, seq (0 = no hint change), next ('' = none), wake.
pub(crate) static HINT: LazyLock<Script> = LazyLock::new(|| {
    let src = format!(
        "{}\n{}",
        APPLY_HINT.replace("@WAKEMAX@", &WAKE_LIST_MAX.to_string()),
        r#"
local G, tenant, seq, ns, wake = ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4], tonumber(ARGV[5])
local update = false
if seq > 0 then
  local cur = redis.call('HGET', G .. 'seq', tenant)
  if not cur or tonumber(cur) < seq then
    update = true
    redis.call('HSET', G .. 'seq', tenant, seq)
  end
end
apply_hint(G, tenant, ns, wake, update)
return 1
"#
    );
    Script::new(&src)
});

/// ARGV[5..]: name, digest, size_bytes, settings, max_attempts, events JSON, schedule
/// JSON or '', then the event names.
pub(crate) static DEPLOY: LazyLock<Script> = LazyLock::new(|| {
    tenant_script(
        r#"
local name = ARGV[5]
local fk = P .. 'fn:' .. name
-- A function is charged its component's size: a replacement the difference.
local was = redis.call('HGET', fk, 'size_bytes')
local delta = C_FN + mem(tonumber(ARGV[7]))
if was then delta = delta - C_FN - mem(tonumber(was)) end
if delta > 0 then
  local full = tenant_full(delta)
  if full then return full end
end
charge(nil, delta)
local old = redis.call('HGET', fk, 'events')
if old then
  for _, e in ipairs(cjson.decode(old)) do redis.call('SREM', P .. 'sub:' .. e, name) end
end
local created = redis.call('HGET', fk, 'created_at') or I(NOW)
redis.call('HSET', fk, 'name', name, 'digest', ARGV[6], 'size_bytes', ARGV[7],
  'settings', ARGV[8], 'max_attempts', ARGV[9], 'events', ARGV[10],
  'created_at', created, 'updated_at', I(NOW))
if ARGV[11] ~= '' then
  redis.call('HSET', fk, 'schedule', ARGV[11])
else
  redis.call('HDEL', fk, 'schedule')
end
redis.call('SADD', P .. 'fns', name)
for i = 12, #ARGV do redis.call('SADD', P .. 'sub:' .. ARGV[i], name) end
return { 'ok', redis.call('HGETALL', fk) }
"#,
    )
});

/// ARGV[5..]: id, function, input, trigger, due ('' = now), idempotency key or '',
/// retry override JSON or '', its max_attempts, parent or '', the function's settings
/// blob the flow arguments were computed from, then FLOW_ARGS flow arguments.
pub(crate) static ENQUEUE: LazyLock<Script> = LazyLock::new(|| {
    tenant_script(
        r#"
local id, created, err, woke = insert_run(ARGV[5], ARGV[6], ARGV[7], ARGV[8], ARGV[9], ARGV[10],
  ARGV[11], ARGV[12], ARGV[13], ARGV[14], read_flow(15))
if type(err) == 'table' then return err end
if err then return { err } end
local wake = woke
local r = redis.call('HMGET', runkey(id), 'due_at', 'status')
if created and r[2] == 'queued' and tonumber(r[1]) <= NOW then wake = wake + 1 end
local pub = publish(wake, false)
return { 'ok', pub or false, created and 1 or 0, run_fields(id) }
"#,
    )
});

/// ARGV[5..]: limit, lease_ms, worker, worker as a JSON string, force publish ('1'/'0').
/// Reaps expired leases, times out waits, then leases up to `limit` due runs.
pub(crate) static CLAIM: LazyLock<Script> = LazyLock::new(|| {
    tenant_script(&format!(
        r#"
local LIMIT, LEASE, WORKER, WORKER_JSON = tonumber(ARGV[5]), tonumber(ARGV[6]), ARGV[7], ARGV[8]
local wake = 0
-- Runs whose worker stopped renewing. What becomes of each (queued again, failed for
-- good, cancelled) is wasq_core::lifecycle::lease_expired's to say: without transitions
-- (ARGV[10] = '') the script only answers which runs need one; with them (ARGV[10] = n,
-- then n × (id, lease token, T_ARGS transition)) it applies each to a run still under
-- that lease, and leaves runs that expired in between to the next claim.
local expired = redis.call('ZRANGEBYSCORE', P .. 'leases', '-inf', NOW, 'LIMIT', 0, {reap})
if ARGV[10] == '' then
  local need = {{}}
  for _, id in ipairs(expired) do
    local r = redis.call('HMGET', runkey(id), 'status', 'lease_token', 'worker', 'attempt',
      'max_attempts', 'cancel_requested')
    if r[1] == 'running' then need[#need + 1] = {{ id, r[2], r[3] or '', r[4], r[5], r[6] }} end
  end
  if #need > 0 then return {{ 'reap', need }} end
end
local given = {{}}
if ARGV[10] ~= '' then
  for j = 0, tonumber(ARGV[10]) - 1 do
    local o = 11 + j * (2 + T_ARGS)
    given[ARGV[o]] = {{ ARGV[o + 1], o + 2 }}
  end
end
for _, id in ipairs(expired) do
  local r = redis.call('HMGET', runkey(id), 'status', 'lease_token')
  if r[1] ~= 'running' then
    redis.call('ZREM', P .. 'leases', id)
  elseif given[id] and given[id][1] == r[2] then
    if apply(id, read_transition(given[id][2])) then wake = wake + 1 end
    wake = wake + resolve_waiters_of(id)
  end
end
-- Waits whose time is up resolve as timed out.
for _, id in ipairs(redis.call('ZRANGEBYSCORE', P .. 'timeouts', '-inf', NOW, 'LIMIT', 0, {reap})) do
  if redis.call('HGET', runkey(id), 'status') == 'waiting' then
    resolve_wait(id, @TIMED_OUT@)
    wake = wake + 1
  else
    redis.call('ZREM', P .. 'timeouts', id)
  end
end
-- Throttle windows that opened: as many parked runs as they have room for go back into
-- the lane, best rank first; while runs stay parked the gate's timer is set to when the
-- window opens next (counting the let-through runs as started now).
for _, gate in ipairs(redis.call('ZRANGEBYSCORE', P .. 'gtimer', '-inf', NOW, 'LIMIT', 0, {reap})) do
  local pk = P .. 'park:' .. gate
  local cfg = redis.call('HGET', P .. 'tcfg', gate)
  local again = nil
  if cfg and redis.call('ZCARD', pk) > 0 then
    local sep = string.find(cfg, '|', 1, true)
    local limit, period = tonumber(string.sub(cfg, 1, sep - 1)), tonumber(string.sub(cfg, sep + 1))
    local n, oldest = 0, NOW
    for i, t in ipairs(redis.call('LRANGE', P .. 'win:' .. gate, 0, limit - 1)) do
      if tonumber(t) <= NOW - period then break end
      n, oldest = i, tonumber(t)
    end
    if limit > n then
      local p = redis.call('ZPOPMIN', pk, limit - n)
      for i = 1, #p, 2 do unpark(p[i], p[i + 1]) end
    end
    if redis.call('ZCARD', pk) > 0 then again = math.max(oldest + period, NOW + 1) end
  end
  if again then
    redis.call('ZADD', P .. 'gtimer', I(again), gate)
  else
    redis.call('ZREM', P .. 'gtimer', gate)
    redis.call('HDEL', P .. 'tcfg', gate)
  end
end
-- Due runs enter the lane, ranked by due time + priority offset.
for _, id in ipairs(redis.call('ZRANGEBYSCORE', P .. 'ready', '-inf', NOW, 'LIMIT', 0, {promote})) do
  local h = redis.call('HMGET', runkey(id), 'due_at', 'rank_offset')
  redis.call('ZREM', P .. 'ready', id)
  redis.call('ZADD', P .. 'q', I(tonumber(h[1]) + tonumber(h[2] or '0')), id)
end
local room = LIMIT
local maxr = redis.call('HGET', P .. 'quotas', 'max_running')
if maxr then room = math.min(room, tonumber(maxr) - redis.call('ZCARD', P .. 'leases')) end
local out = {{}}
local parks = {park_budget}
-- The lane's best runs, fetched a batch at a time: the loop only takes runs out of the
-- lane (leased, parked or stale), so the next batch starts at the lane's head again.
local head, hi = {{}}, 1
while #out < room and parks > 0 do
  if hi > #head then
    head, hi = redis.call('ZRANGE', P .. 'q', 0, math.min(room - #out, 100) - 1, 'WITHSCORES'), 1
  end
  local id, score = head[hi], head[hi + 1]
  if not id then break end
  hi = hi + 2
  local rk = runkey(id)
  -- MOVE_FIELDS first (handed to move), then what the gates and the lease need.
  local r = redis.call('HMGET', rk, 'status', 'created_at', 'wait_event', 'wait_run', 'cgate',
    'parked', 'attempt', 'climit', 'tgate', 'tlimit', 'tperiod', 'nosteps', 'lease_token')
  local status, cgate, attempt, climit = r[1], r[5], r[7], r[8]
  local tgate, tlimit, tperiod = r[9], r[10], r[11]
  local throttled = tgate and status == 'queued' and attempt == '0'
  if status ~= 'queued' and status ~= 'sleeping' then
    redis.call('ZREM', P .. 'q', id)
  elseif cgate and redis.call('SCARD', P .. 'crun:' .. cgate) >= tonumber(climit) then
    park(id, cgate, score)
    parks = parks - 1
  elseif throttled and window_full(tgate, tonumber(tlimit), tonumber(tperiod)) then
    park(id, tgate, score)
    redis.call('HSET', P .. 'tcfg', tgate, tlimit .. '|' .. tperiod)
    redis.call('ZADD', P .. 'gtimer', 'LT',
      I(window_full(tgate, tonumber(tlimit), tonumber(tperiod))), tgate)
    parks = parks - 1
  else
    if throttled then window_log(tgate, tonumber(tlimit)) end
    -- Waking from a sleep continues the attempt; anything else starts one.
    local n, resumed = tonumber(attempt), '0'
    if status == 'sleeping' then
      resumed = '1'
      if n < 1 then n = 1 end
    else
      n = n + 1
    end
    move(id, 'running', {{ 'attempt', I(n), 'resumed', resumed,
      'lease_expires_at', I(NOW + LEASE), 'worker', WORKER,
      'lease_token', I(tonumber(r[13] or '0') + 1) }}, r)
    redis.call('RPUSH', P .. 'att:' .. id, I(n) .. '|' .. I(NOW) .. '|' .. WORKER_JSON)
    charge(id, C_ATT + #WORKER_JSON)
    out[#out + 1] = load_run(id, r[12] == '1')
  end
end
-- Wake other workers only for what this claim left behind.
if wake > 0 then wake = math.min(wake, redis.call('ZCARD', P .. 'q')) end
-- A visit that found nothing republishes anyway, repairing a stale global hint.
local pub = publish(wake, ARGV[9] == '1' or #out == 0)
return {{ 'ok', pub or false, out }}
"#,
        reap = REAP_BATCH,
        promote = PROMOTE_BATCH,
        park_budget = PARK_BUDGET,
    ))
});

/// ARGV[5..]: lease_ms, then run id and token pairs. Returns the ids no longer held.
pub(crate) static RENEW: LazyLock<Script> = LazyLock::new(|| {
    tenant_script(
        r#"
local exp = I(NOW + tonumber(ARGV[5]))
local lost, cancelling = {}, {}
for i = 6, #ARGV, 2 do
  local id, token = ARGV[i], ARGV[i + 1]
  local rk = runkey(id)
  local r = redis.call('HMGET', rk, 'status', 'lease_token', 'cancel_requested')
  if r[1] == 'running' and r[2] == token and r[3] == '0' then
    redis.call('HSET', rk, 'lease_expires_at', exp)
    redis.call('ZADD', P .. 'leases', exp, id)
  elseif r[1] == 'running' and r[2] == token then
    cancelling[#cancelling + 1] = id
  else
    lost[#lost + 1] = id
  end
end
local pub = publish(0, false)
return { 'ok', pub or false, lost, cancelling }
"#,
    )
});

/// ARGV[5..]: id, token, kind; 'step': field, attempt-independent output, the two cut
/// markers (run's log budget, tenant's quota), then log lines; 'logs': the two markers,
/// then log lines; 'progress': progress JSON.
pub(crate) static RECORD: LazyLock<Script> = LazyLock::new(|| {
    tenant_script(
        r#"
local id, kind = ARGV[5], ARGV[7]
local bad = check_lease(id, ARGV[6])
if bad then return { bad } end
local rk = runkey(id)
if kind == 'progress' then
  -- Progress replaces itself (bounded by the sandbox): charged, never refused.
  charge(id, blob_delta(rk, { 'progress', ARGV[8] }))
  redis.call('HSET', rk, 'progress', ARGV[8], 'updated_at', I(NOW))
  return { 'ok' }
end
local first_log = 10
if kind == 'step' then
  first_log = 12
  local field, output = ARGV[8], ARGV[9]
  -- A step stored already (a replayed record) adds nothing; a new one must fit.
  if redis.call('HEXISTS', P .. 'steps:' .. id, field) == 0 then
    local full = run_full(id, run_bytes(id), step_cost(id, field, output))
    if full then return full end
  end
  append_logs(id, first_log, ARGV[10], ARGV[11])
  write_step(id, field, output, redis.call('HGET', rk, 'attempt'))
else
  append_logs(id, first_log, ARGV[8], ARGV[9])
end
return { 'ok' }
"#,
    )
});

/// ARGV[5..]: id, token, then three transitions of T_ARGS each, computed by
/// `wasq_core::lifecycle::finish` (the outcome's; for a run that resumed, '' when the
/// same; for a run whose cancel was requested, '' when the outcome stands), then for a
/// wait: wait JSON, step field, until or '', 'event'|'run', event name or run id, the
/// resolution of a missing run.
pub(crate) static FINISH: LazyLock<Script> = LazyLock::new(|| {
    tenant_script(
        r#"
local ID = ARGV[5]
local rk = runkey(ID)
-- MOVE_FIELDS first (handed to the one move of this run below), then the lease and the
-- flags that pick the transition.
local m = redis.call('HMGET', rk, 'status', 'created_at', 'wait_event', 'wait_run', 'cgate',
  'parked', 'lease_token', 'resumed', 'cancel_requested')
if not m[1] then return { 'not_found' } end
if m[1] ~= 'running' or m[7] ~= ARGV[6] then return { 'lease_lost' } end
local t = read_transition(7)
if m[9] == '1' and ARGV[7 + 2 * T_ARGS] ~= '' then
  t = read_transition(7 + 2 * T_ARGS)
elseif m[8] == '1' and ARGV[7 + T_ARGS] ~= '' then
  t = read_transition(7 + T_ARGS)
end
-- An output over a storage quota is refused before anything changes; the worker then
-- fails the run (an error is always stored). It is kept twice, as the run's output and
-- in the resolution its waiters receive, and charged by `move`.
if t.hasout == '1' then
  local full = run_full(ID, run_bytes(ID), mem(#t.out) + mem(#t.res))
  if full then return full end
end
local W = 7 + 3 * T_ARGS
local extra = nil
if t.status == 'waiting' then extra = { 'wait', ARGV[W], 'wait_step', ARGV[W + 1] } end
local wake = 0
if apply(ID, t, m, extra) then wake = 1 end
if t.status == 'waiting' then
  local until_, on, target = ARGV[W + 2], ARGV[W + 3], ARGV[W + 4]
  if until_ ~= '' then redis.call('ZADD', P .. 'timeouts', until_, ID) end
  if on == 'event' then
    local ver = redis.call('HINCRBY', P .. 'waitver', target, 1)
    redis.call('HSET', rk, 'wait_event', target, 'wait_ver', ver)
    redis.call('SADD', P .. 'waiters:' .. target, ID)
  else
    redis.call('HSET', rk, 'wait_run', target)
    redis.call('SADD', P .. 'rw:' .. target, ID)
    -- A run that already ended resolves the wait at once.
    local r = redis.call('HMGET', runkey(target), 'status', 'resolution')
    if not r[1] then
      resolve_wait(ID, ARGV[W + 5])
      wake = 1
    elseif r[2] then
      resolve_wait(ID, r[2])
      wake = 1
    end
  end
end
wake = wake + resolve_waiters_of(ID)
local pub = publish(wake, false)
-- A success stores the output the caller sent: the reply leaves it out.
return { 'ok', pub or false, run_fields(ID, t.hasout == '1') }
"#,
    )
});

/// ARGV[5..]: id, the status the transition was computed for, 'mark' (a running run:
/// its cancel is requested) or 'end', the cancel's error JSON, a T_ARGS transition (for
/// 'end'), the two log-cut markers and the log line (`RunAction::log_line`). `stale` when
/// the run's status changed since.
pub(crate) static CANCEL: LazyLock<Script> = LazyLock::new(|| {
    tenant_script(
        r#"
local ID = ARGV[5]
local rk = runkey(ID)
local status = redis.call('HGET', rk, 'status')
if not status then return { 'not_found' } end
if status ~= ARGV[6] then return { 'stale' } end
local wake = 0
if ARGV[7] == 'mark' then
  local fields = { 'error', ARGV[8] }
  charge(ID, blob_delta(rk, fields))
  redis.call('HSET', rk, 'cancel_requested', '1', 'updated_at', I(NOW), unpack(fields))
else
  apply(ID, read_transition(9))
  wake = resolve_waiters_of(ID)
end
append_logs(ID, 11 + T_ARGS, ARGV[9 + T_ARGS], ARGV[10 + T_ARGS])
local pub = publish(wake, false)
return { 'ok', pub or false, run_fields(ID) }
"#,
    )
});

/// ARGV[5..]: id, the status and attempt the retry was computed for, the attempts it
/// grants, the cap factor of max_queued, a T_ARGS transition, the two log-cut markers and
/// the log line. `stale` when the run changed since.
pub(crate) static RETRY: LazyLock<Script> = LazyLock::new(|| {
    tenant_script(
        r#"
local ID = ARGV[5]
local rk = runkey(ID)
local r = redis.call('HMGET', rk, 'status', 'attempt')
if not r[1] then return { 'not_found' } end
if r[1] ~= ARGV[6] or r[2] ~= ARGV[7] then return { 'stale' } end
-- A retried run is queued like a new one: the tenant's max_queued applies.
local maxq = redis.call('HGET', P .. 'quotas', 'max_queued')
if maxq and redis.call('ZCARD', P .. 'st:queued') + 1 > tonumber(maxq) * tonumber(ARGV[9]) then
  return { 'quota' }
end
redis.call('HINCRBY', rk, 'max_attempts', tonumber(ARGV[8]))
apply(ID, read_transition(10))
local L = 10 + T_ARGS
append_logs(ID, L + 2, ARGV[L], ARGV[L + 1])
local pub = publish(1, false)
return { 'ok', pub or false, run_fields(ID) }
"#,
    )
});

/// ARGV[5..]: event id, name, data JSON (the input of started runs), resolution for
/// resumed waiters, expected waiter version ('' = unknown), number of matched waiters m,
/// then m (run id, wait version) pairs, then the number of subscribers k and, per
/// subscriber in name order: function, fresh run id, its settings blob ('' if gone) and
/// FLOW_ARGS flow arguments. `stale` when the subscribers or their settings changed.
///
/// Filters are matched in Rust with `wasq_core::event_matches`: the first call without
/// a version answers `match` with the version of the name's waiter set if there are
/// waiters; Rust reads them a page at a time ([`WAITERS`], so no reply holds them all) and
/// calls again with the matches and the version they were computed at. The version grows with every waiter
/// registered for the name, so a waiter that arrived in between makes the script answer
/// `match` again instead of missing it; waiters that left in between are skipped by
/// re-checking their status and wait version.
pub(crate) static SEND_EVENT: LazyLock<Script> = LazyLock::new(|| {
    tenant_script(
        r#"
local EID, NAME, DATA, RES, EXPECTED = ARGV[5], ARGV[6], ARGV[7], ARGV[8], ARGV[9]
local m = tonumber(ARGV[10])
local seen = redis.call('HGET', P .. 'events', EID)
if seen and tonumber(seen) > NOW - WINDOW then return { 'dup' } end
local wk = P .. 'waiters:' .. NAME
local ver = redis.call('HGET', P .. 'waitver', NAME) or '0'
if (EXPECTED == '' and redis.call('SCARD', wk) > 0) or (EXPECTED ~= '' and EXPECTED ~= ver) then
  -- Rust reads the waiters a page at a time (WAITERS) and matches their filters.
  return { 'match', ver }
end
local subs = redis.call('SMEMBERS', P .. 'sub:' .. NAME)
table.sort(subs)
-- The subscribers Rust computed flow arguments for must be today's, with today's settings.
local sb = 11 + 2 * m
local k = tonumber(ARGV[sb])
local stride = 3 + FLOW_ARGS
if k ~= #subs then return { 'stale' } end
for i, fname in ipairs(subs) do
  local o = sb + 1 + (i - 1) * stride
  if ARGV[o] ~= fname or (redis.call('HGET', P .. 'fn:' .. fname, 'settings') or '') ~= ARGV[o + 2] then
    return { 'stale' }
  end
  local fl = read_flow(o + 3)
  if fl.dgate ~= '' and (redis.call('HGET', P .. 'deb', fl.dgate) or '') ~= fl.dprev then
    return { 'stale' }
  end
end
-- max_queued: every subscriber counts (wasq_core::lifecycle::Admission::Event).
local maxq = redis.call('HGET', P .. 'quotas', 'max_queued')
if maxq and k > 0 and redis.call('ZCARD', P .. 'st:queued') + k > tonumber(maxq) then
  return { 'quota', maxq }
end
-- Storage: the event's dedup record and every run it starts, refused as a whole.
local cost = event_cost(EID)
local maxrun = quota('max_run_bytes')
for i, fname in ipairs(subs) do
  local o = sb + 1 + (i - 1) * stride
  local c = run_cost(DATA, 'event:' .. NAME, ARGV[o + 2], 'event:' .. EID, '', read_flow(o + 3))
  if maxrun and c > maxrun then return { 'storage', 'run', '0', I(c), I(maxrun) } end
  cost = cost + c
end
local full = tenant_full(cost)
if full then return full end
if seen then charge(nil, -event_cost(EID)) end
redis.call('HSET', P .. 'events', EID, I(NOW))
redis.call('ZADD', P .. 'evz', NOW, EID)
charge(nil, event_cost(EID))
forget_events(100)
local wake = 0
local started, resumed = {}, {}
for i, fname in ipairs(subs) do
  local o = sb + 1 + (i - 1) * stride
  local fl = read_flow(o + 3)
  fl.enforce = '0'
  -- One run per function per event, however often it is delivered.
  local id, created, _, woke = insert_run(ARGV[o + 1], fname, DATA, 'event:' .. NAME, '',
    'event:' .. EID, '', '', '', ARGV[o + 2], fl)
  if id then
    started[#started + 1] = id
    if created then wake = wake + 1 + woke end
  end
end
for i = 0, m - 1 do
  local id, wver = ARGV[11 + 2 * i], ARGV[12 + 2 * i]
  local r = redis.call('HMGET', runkey(id), 'status', 'wait_event', 'wait_ver')
  if r[1] == 'waiting' and r[2] == NAME and r[3] == wver then
    resolve_wait(id, RES)
    resumed[#resumed + 1] = id
    wake = wake + 1
  end
end
local pub = publish(wake, false)
return { 'ok', pub or false, started, resumed }
"#,
    )
});

/// ARGV[5..]: event name, SSCAN cursor, page size. A page of the runs waiting for the
/// event: the next cursor ('0' at the end) and (run id, wait version, wait JSON) of those
/// still waiting for it.
pub(crate) static WAITERS: LazyLock<Script> = LazyLock::new(|| {
    tenant_script(
        r#"
local name = ARGV[5]
local page = redis.call('SSCAN', P .. 'waiters:' .. name, ARGV[6], 'COUNT', ARGV[7])
local ws = {}
for _, w in ipairs(page[2]) do
  local r = redis.call('HMGET', runkey(w), 'status', 'wait_event', 'wait_ver', 'wait')
  if r[1] == 'waiting' and r[2] == name then ws[#ws + 1] = { w, r[3], r[4] } end
end
return { 'ok', page[1], ws }
"#,
    )
});

/// ARGV[5..]: succeeded_before, failed_before, limit. Deletes ended runs with all they
/// recorded; returns how many.
pub(crate) static PURGE: LazyLock<Script> = LazyLock::new(|| {
    tenant_script(
        r#"
local LIMIT = tonumber(ARGV[7])
local n = 0
local function delete(id)
  local rk = runkey(id)
  local r = redis.call('HMGET', rk, 'status', 'function', 'parent', 'idempotency_key', 'sbytes',
    'lbytes', 'digest')
  charge(nil, -(tonumber(r[5] or '0') + tonumber(r[6] or '0')))
  if r[7] and redis.call('HINCRBY', P .. 'rdig', r[7], -1) <= 0 then
    redis.call('HDEL', P .. 'rdig', r[7])
  end
  redis.call('ZREM', P .. 'all', id)
  redis.call('ZREM', P .. 'ended:ok', id)
  redis.call('ZREM', P .. 'ended:bad', id)
  if r[1] then redis.call('ZREM', P .. 'st:' .. r[1], id) end
  if r[2] then redis.call('ZREM', P .. 'byfn:' .. r[2], id) end
  if r[3] then redis.call('ZREM', P .. 'kids:' .. r[3], id) end
  if r[2] and r[4] then
    local ik = P .. 'idem:' .. r[2]
    local v = redis.call('HGET', ik, r[4])
    if v and string.sub(v, -#id) == id then redis.call('HDEL', ik, r[4]) end
  end
  redis.call('DEL', rk, P .. 'steps:' .. id, P .. 'stepseq:' .. id, P .. 'att:' .. id,
    P .. 'logs:' .. id, P .. 'rw:' .. id)
end
for _, pair in ipairs({ { 'ended:ok', ARGV[5] }, { 'ended:bad', ARGV[6] } }) do
  if n < LIMIT then
    local ids = redis.call('ZRANGEBYSCORE', P .. pair[1], '-inf', '(' .. pair[2], 'LIMIT', 0, LIMIT - n)
    for _, id in ipairs(ids) do
      delete(id)
      n = n + 1
    end
  end
end
-- Event ids are only remembered for their dedup window.
forget_events(LIMIT)
return { 'ok', n }
"#,
    )
});

/// ARGV[5..]: id, steps listed, executions listed. A consistent read of one run: its
/// fields, executions in all and the latest ones, steps in all and the first ones with the
/// sizes of their outputs (never the outputs).
pub(crate) static GET: LazyLock<Script> = LazyLock::new(|| {
    tenant_script(
        r#"
local id = ARGV[5]
if redis.call('EXISTS', runkey(id)) == 0 then return { 'not_found' } end
local ak, sk = P .. 'att:' .. id, P .. 'stepseq:' .. id
local steps = redis.call('LRANGE', sk, 0, tonumber(ARGV[6]) - 1)
local sizes = {}
for i, e in ipairs(steps) do
  sizes[i] = redis.call('HSTRLEN', P .. 'steps:' .. id, string.match(e, '^[^|]*|[^|]*|(.*)$'))
end
return { 'ok', run_fields(id), redis.call('LLEN', ak),
  redis.call('LRANGE', ak, -tonumber(ARGV[7]), -1), redis.call('LLEN', sk), steps, sizes }
"#,
    )
});

/// ARGV[5..]: id, skip, limit. A page of a run's steps with the sizes of their outputs.
pub(crate) static STEPS: LazyLock<Script> = LazyLock::new(|| {
    tenant_script(
        r#"
local id = ARGV[5]
if redis.call('EXISTS', runkey(id)) == 0 then return { 'not_found' } end
local from = tonumber(ARGV[6])
local steps = redis.call('LRANGE', P .. 'stepseq:' .. id, from, from + tonumber(ARGV[7]) - 1)
local sizes = {}
for i, e in ipairs(steps) do
  sizes[i] = redis.call('HSTRLEN', P .. 'steps:' .. id, string.match(e, '^[^|]*|[^|]*|(.*)$'))
end
return { 'ok', steps, sizes }
"#,
    )
});

/// ARGV[5..]: id, step field. One step's order entry and output.
pub(crate) static STEP: LazyLock<Script> = LazyLock::new(|| {
    tenant_script(
        r#"
local id, field = ARGV[5], ARGV[6]
local output = redis.call('HGET', P .. 'steps:' .. id, field)
if not output then return { 'not_found' } end
for _, e in ipairs(redis.call('LRANGE', P .. 'stepseq:' .. id, 0, -1)) do
  if string.match(e, '^[^|]*|[^|]*|(.*)$') == field then return { 'ok', e, output } end
end
return { 'not_found' }
"#,
    )
});

/// The components the tenant's functions and runs use: its functions' digests, and the
/// digests runs pin (`rdig`: digest → runs). A tenant whose `rdig` was never built (its
/// runs predate it) gets it built first, from every run, once.
pub(crate) static DIGESTS: LazyLock<Script> = LazyLock::new(|| {
    tenant_script(
        r#"
if redis.call('HGET', P .. 'meta', 'rdig') ~= '1' then
  redis.call('DEL', P .. 'rdig')
  for _, id in ipairs(redis.call('ZRANGE', P .. 'all', 0, -1)) do
    local d = redis.call('HGET', runkey(id), 'digest')
    if d then redis.call('HINCRBY', P .. 'rdig', d, 1) end
  end
  redis.call('HSET', P .. 'meta', 'rdig', '1')
end
local out = redis.call('HKEYS', P .. 'rdig')
for _, name in ipairs(redis.call('SMEMBERS', P .. 'fns')) do
  local d = redis.call('HGET', P .. 'fn:' .. name, 'digest')
  if d then out[#out + 1] = d end
end
return { 'ok', out }
"#,
    )
});

/// ARGV[5..]: index key suffix, start, stop. Runs of one listing index, newest first.
pub(crate) static LIST: LazyLock<Script> = LazyLock::new(|| {
    tenant_script(
        r#"
local out = {}
local ids = redis.call('ZREVRANGE', P .. ARGV[5], ARGV[6], ARGV[7])
for _, id in ipairs(ids) do
  local h = run_fields(id)
  if h[1] then out[#out + 1] = h end
end
return { 'ok', #ids, out }
"#,
    )
});

/// All functions of a tenant.
pub(crate) static FUNCTIONS: LazyLock<Script> = LazyLock::new(|| {
    tenant_script(
        r#"
local out = {}
for _, name in ipairs(redis.call('SMEMBERS', P .. 'fns')) do
  local h = redis.call('HGETALL', P .. 'fn:' .. name)
  if #h > 0 then out[#out + 1] = h end
end
return { 'ok', out }
"#,
    )
});
