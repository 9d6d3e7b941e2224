-- The state of one call, set by `enter` (at the end of this file) before a function's
-- body runs: the library is loaded once and its functions share these. ARGV[1..4]:
-- tenant key prefix P, global prefix G (or ''), now, tenant.
local ARGV, P, G, NOW, TENANT
-- NOW as the caller sent it (an integer in decimal, as `I` writes numbers). Arguments to
-- `redis.call` are passed as strings where they can be: Redis formats a Lua number with
-- snprintf("%.17g"), about 2.5k instructions each (5% of an enqueue's before 2026-12-05).
local NOWS
local WINDOW = @WINDOW@
local WAKEMAX = @WAKEMAX@
local FLOW_ARGS = @FLOW_ARGS@
local T_ARGS = @T_ARGS@

-- A member `leases` always holds, at score +inf, so that Redis keeps it a skiplist (see
-- LEASE_PIN in lib.rs): counts of running runs leave it out (`leased`), heads read past
-- it (an infinite score is no due time), listings skip it. PINNED: this call made sure
-- it is there.
local LEASE_PIN = @LEASE_PIN@
local PINNED
local function I(n) return sformat('%d', n) end
-- The tenant's fixed keys, made once per tenant prefix (consecutive calls nearly always
-- serve the same tenant): building a key name costs a Lua string, which costs about as
-- much as a cheap Redis command.
local KP, KQ, KREADY, KLEASES, KUSAGE, KMETA, KQUOTAS, KTIMEOUTS, KGTIMER, KENDED
local KRDIG, KSETS, KTCFG, KDEB, KST, KQUEUES, KLANES, KNQ, KQFN, KBYFN
-- NQDELTA: the change this call made to the count of queued runs, written to `nq` once by
-- settle_charges (a claim of 50 runs writes it once, not 50 times).
local NQDELTA
-- Every status a run can have. A queued run is indexed by its function, `qfn:<function>`;
-- a run in any other status by its function, `byfn:<function>`, and by the status,
-- `st:<status>` — but a running run by its lease (`leases`) alone: it is there anyway,
-- and a second small zset written at every claim and end cost about 5% of a drained
-- run's Redis instructions (a packed zset of up to 128 runs is scanned whole at each
-- insert). So a run of a backlog costs one index entry (~150 B) besides its lane's,
-- `qfn:<f>` with `byfn:<f>` hold a function's runs, and `st:`, `leases` and every `qfn:`
-- the tenant's (there is no index of all runs: an unfiltered listing merges these).
-- `leases` is scored by expiry, not creation: a listing orders its runs by their ids,
-- which begin with their creation time (wasq_core::ids). An older wasq kept running runs
-- in `st:running` too: nothing reads it now, and a tenant's first purge drops it.
-- Runs queued before `qfn:` existed stay in `st:queued` and `byfn:` until they leave the
-- status. `nq` counts the queued runs (for max_queued) plus one: a key the first INCRBY
-- creates (a tenant from before the count) is told from one that held 0 runs, and counted.
local STATUSES = { @STATUSES@ }
-- The key `P .. kind .. name`, made once and kept in `cache` (per tenant; RK: per call).
local function named_key(cache, kind, name)
  local k = cache[name]
  if not k then
    k = P .. kind .. name
    cache[name] = k
  end
  return k
end
-- RK: the run keys this call made, by id (a run's key is used about ten times per
-- transition, and a concatenation makes and hashes a new Lua string each time).
local RK
local function runkey(id) return named_key(RK, 'run:', id) end
local function stkey(status) return named_key(KST, 'st:', status) end
local function qfnkey(f) return named_key(KQFN, 'qfn:', f) end
local function byfnkey(f) return named_key(KBYFN, 'byfn:', f) end
-- Writes to the tenant's zsets, deferred: a call that moves many runs (a claim, a batch
-- of ends, enqueues sent together) sends each zset it writes one ZADD or ZREM with all
-- their members, instead of one per run and index (a drained run wrote its indexes with
-- seven). What that saves is a command's fixed part — about 2.9k instructions of the
-- ~11k a `redis.call` of one member costs (`redis_ir`, a Redis with symbols); a member's
-- own work stays — so the buffers are flat arrays, made only by a call that moves a few
-- runs or more (`zdefer`): a Lua table costs about as much as that fixed part.
-- ZB[key]: the pending writes of one kind, as the command's arguments (score, id, ... for
-- ZADD; id, ... for ZREM); ZBADD[key] which kind; a write of the other kind sends the
-- key's pending ones first, so writes to one member keep their order. ZB nil: every
-- write goes at once. While it is set no buffered key may be read before `zflush` sends
-- it: `publish`, `leave` and `count_queued` flush every key, a claim its lane before it
-- reads it again, a ZADD with options its key. ZALT[key]: where a member that the ZREM
-- of `key` did not find may be instead (`st:queued` for a `qfn:`: a run queued before
-- `qfn:` existed).
local ZB, ZBK, ZBADD, ZALT
-- The arguments of a command, at most ZCHUNK at a time (`unpack` has a limit).
local ZCHUNK = 512
local function zsend(cmd, key, args)
  local n = 0
  for i = 1, #args, ZCHUNK do
    n = n + rcall(cmd, key, unpack(args, i, math.min(i + ZCHUNK - 1, #args)))
  end
  return n
end
local function zsend_key(key)
  local b = ZB[key]
  if not b then return end
  ZB[key] = nil
  if ZBADD[key] then
    zsend('ZADD', key, b)
  elseif zsend('ZREM', key, b) < #b and ZALT and ZALT[key] then
    zsend('ZREM', ZALT[key], b)
  end
end
-- Sends the pending writes of `only` (nil: of every key).
local function zflush(only)
  if not ZB then return end
  if only then return zsend_key(only) end
  if #ZBK == 0 then return end
  for i = 1, #ZBK do zsend_key(ZBK[i]) end
  ZBK = {}
end
-- The buffer for a write of kind `add` to `key`.
local function zbuf(key, add)
  local b = ZB[key]
  if b and ZBADD[key] ~= add then
    zsend_key(key)
    b = nil
  end
  if not b then
    b = {}
    ZB[key], ZBADD[key] = b, add
    ZBK[#ZBK + 1] = key
  end
  return b
end
-- ZADD key score id, deferred while ZB is set. (zbuf only when the key's buffer is to
-- be made: a Lua function call per write costs what the batching saves per member.)
local function zadd1(key, score, id)
  if not ZB then return rcall('ZADD', key, score, id) end
  local b = ZB[key]
  if not b or not ZBADD[key] then b = zbuf(key, true) end
  local n = #b
  b[n + 1], b[n + 2] = score, id
end
-- ZREM key id, deferred while ZB is set.
local function zrem1(key, id)
  if not ZB then return rcall('ZREM', key, id) end
  local b = ZB[key]
  if not b or ZBADD[key] then b = zbuf(key, false) end
  b[#b + 1] = id
end
-- FNS: the functions an enqueue of several runs read, by name (admission.lua); PINS: the
-- runs it created, by what they pin (`rdig`'s field), written by `leave`. Both only
-- while writes are deferred (a call of one run would only pay for the table).
local FNS, PINS
-- Defers this call's zset writes when it moves `n` more runs, at least ZMIN (below that
-- the tables cost more than the commands saved); with `admits` (it creates runs), also
-- its reads of functions and counts of pins.
local ZMIN = 3
local function zdefer(n, admits)
  if n < ZMIN then return end
  ZB, ZBK, ZBADD = {}, {}, {}
  if admits then FNS, PINS = {}, {} end
end

-- The indexes that hold every run of the tenant between them: `st:<status>` for each
-- status but running, `leases`, and `qfn:<function>` for each function (`queued`: only
-- those a queued run is in).
local function run_indexes(queued)
  local keys = {}
  for _, status in ipairs(STATUSES) do
    if status == 'running' then
      if not queued then keys[#keys + 1] = KLEASES end
    elseif not queued or status == 'queued' then
      keys[#keys + 1] = stkey(status)
    end
  end
  for _, f in ipairs(rcall('SMEMBERS', P .. 'fns')) do keys[#keys + 1] = qfnkey(f) end
  return keys
end
-- The tenant's queued runs, counted from the indexes (once per tenant from before `nq`).
local function count_queued()
  zflush()
  local n = 0
  for _, k in ipairs(run_indexes(true)) do n = n + rcall('ZCARD', k) end
  return n
end
-- The tenant's queued runs (max_queued), with this call's changes.
local function queued_count()
  local v = rcall('GET', KNQ)
  if v then return tonumber(v) - 1 + NQDELTA end
  return count_queued()
end
-- Moves run `id` of function `f` (created at `created`) from status index `old` (nil: a new
-- run) to `new`'s. (A running run's is its lease, which `move` keeps.)
local function reindex(id, f, old, new, created)
  if old == 'queued' then
    NQDELTA = NQDELTA - 1
    local qk = qfnkey(f)
    if ZB then
      -- Deferred: the ZREM's count is not known here. A run queued before `qfn:` existed
      -- is in `st:queued` (ZALT) and in `byfn:` already, at the same score.
      if not ZALT then ZALT = {} end
      ZALT[qk] = stkey('queued')
      zrem1(qk, id)
      zadd1(byfnkey(f), created, id)
    elseif rcall('ZREM', qk, id) == 1 then
      rcall('ZADD', byfnkey(f), created, id)
    else
      rcall('ZREM', stkey('queued'), id)
    end
  elseif old and old ~= 'running' then
    zrem1(stkey(old), id)
  end
  if new == 'queued' then
    if old then zrem1(byfnkey(f), id) end
    zadd1(qfnkey(f), created, id)
    NQDELTA = NQDELTA + 1
  else
    if not old then zadd1(byfnkey(f), created, id) end
    if new ~= 'running' then zadd1(stkey(new), created, id) end
  end
end

-- Storage accounting (wasq_core::storage): what each record costs besides the bytes
-- stored whole (their length), from RedisStore's cost model; the quotas are the copies
-- in `quotas` (none: unlimited). A run keeps its own bytes in `sbytes` and `lbytes`.
-- KEY: a key of the run's own (its `logs:`, `steps:`, `stepseq:`), charged when the
-- run's first line or step creates it. Key names count at their length (the tenant's
-- prefix P varies); the constants are net of it.
local C_RUN, C_ATT, C_STEP, C_LOG, C_EVENT, C_FN = @COSTS@
-- An input kept in its own key (`in:<id>`): the key's entry and headers, besides the
-- prefix P and the input.
local C_IN = @INPUT_KEY_COST@
-- An input kept in pieces in the run's hash: each piece's field name and headers.
local C_PIECE = 8
local KEY
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
-- The tenant's quotas, read once per script call (with the meta: tenant_meta) on first
-- use; directory.rs writes them from Rust, and no script changes them (one only moves
-- those an older wasq kept elsewhere: `quota`).
local QUOTA_NAMES = { 'max_running', 'max_queued', 'max_stored_bytes', 'max_run_bytes',
  'max_run_log_bytes' }
-- The fields of the tenant's `meta` a call reads, in one HMGET, at most once per call
-- (tenant_meta): what `publish` needs (next, mq, feed), then `qm` and the quotas, which
-- Rust mirrors there (directory.rs) so that they cost no read of their own: every
-- enqueue, claim and end needs both. The call keeps the copy current where it writes
-- one of these fields itself.
-- (Built with a plain loop: the library's top level, run when it loads, has no `unpack`.)
local META_FIELDS = { 'next', 'mq', 'feed', 'qm' }
for i = 1, #QUOTA_NAMES do META_FIELDS[4 + i] = QUOTA_NAMES[i] end
local METAH = nil
local function tenant_meta()
  if not METAH then METAH = rcall('HMGET', KMETA, unpack(META_FIELDS)) end
  return METAH
end
local QUOTAS = nil
local function quota(name)
  if not QUOTAS then
    local m = tenant_meta()
    local v = { unpack(m, 5, 4 + #QUOTA_NAMES) }
    if not m[4] then
      -- A tenant whose quotas an older wasq mirrored into a hash of their own (`quotas`),
      -- or that has none: moved into the meta, once.
      v = rcall('HMGET', KQUOTAS, unpack(QUOTA_NAMES))
      local f = { 'qm', '1' }
      for i, n in ipairs(QUOTA_NAMES) do
        if v[i] then
          f[#f + 1] = n
          f[#f + 1] = v[i]
        end
        m[4 + i] = v[i]
      end
      rcall('HSET', KMETA, unpack(f))
      rcall('DEL', KQUOTAS)
      m[4] = '1'
    end
    QUOTAS = { max_running = tonumber(v[1]), max_queued = tonumber(v[2]),
      max_stored_bytes = tonumber(v[3]), max_run_bytes = tonumber(v[4]),
      max_run_log_bytes = tonumber(v[5]) }
  end
  return QUOTAS[name]
end
-- Charges are summed over the call and written once when it returns (`leave`): the
-- tenant's stored bytes, executions and fuel, and each run's `sbytes` and `lbytes`.
-- Whatever reads them within the call adds what is pending (`stored`, `pending`).
local TDELTA, RDELTA, UEXEC, UFUEL
-- Adds n bytes to the tenant's usage and, with an id, to the run's `field` (sbytes).
local function charge(id, n, field)
  if n == 0 then return end
  TDELTA = TDELTA + n
  if id then
    local f, d = field or 'sbytes', RDELTA[id]
    if not d then
      d = {}
      RDELTA[id] = d
    end
    d[f] = (d[f] or 0) + n
  end
end
-- What this call charged run `id`'s field `f` so far, not written yet.
local function pending(id, f)
  local d = RDELTA[id]
  return d and d[f] or 0
end
-- USED: the tenant's stored bytes as this call read them (nil: not read yet). Only
-- settle_charges writes them, when the call returns, so one read serves a whole batch of
-- ends (it was an HGET per end).
local USED
local function stored()
  if not USED then USED = tonumber(rcall('HGET', KUSAGE, 'stored') or '0') end
  return USED + TDELTA
end
-- Writes the call's charges. A run deleted within the call must have none pending.
local function settle_charges()
  if PINS then
    for pin, n in pairs(PINS) do rcall('HINCRBY', KRDIG, pin, I(n)) end
    PINS = nil
  end
  if TDELTA ~= 0 then rcall('HINCRBY', KUSAGE, 'stored', TDELTA) end
  if UEXEC ~= 0 then rcall('HINCRBY', KUSAGE, 'attempts', UEXEC) end
  if UFUEL ~= 0 then rcall('HINCRBY', KUSAGE, 'fuel', UFUEL) end
  if NQDELTA ~= 0 and rcall('INCRBY', KNQ, NQDELTA) == NQDELTA then
    rcall('SET', KNQ, count_queued() + 1)
  end
  for id, d in pairs(RDELTA) do
    local rk = runkey(id)
    for f, n in pairs(d) do
      if n ~= 0 then rcall('HINCRBY', rk, f, n) end
    end
  end
  TDELTA, RDELTA, UEXEC, UFUEL, NQDELTA, USED = 0, {}, 0, 0, 0, nil
end
-- nil when the tenant has room for n more bytes, else the reply refusing them. Usage is
-- only read when there is a quota to hold it against.
local function tenant_full(n)
  local max = quota('max_stored_bytes')
  if not max then return nil end
  local used = stored()
  if used + n > max then return { 'storage', 'tenant', I(used), I(n), I(max) } end
  return nil
end
local function run_bytes(id)
  return tonumber(rcall('HGET', runkey(id), 'sbytes') or '0') + pending(id, 'sbytes')
end
-- nil when run `id` (used: its bytes so far, nil to read them) and its tenant have room
-- for n more bytes.
local function run_full(id, used, n)
  local max = quota('max_run_bytes')
  if max then
    used = used or run_bytes(id)
    if used + n > max then return { 'storage', 'run', I(used), I(n), I(max) } end
  end
  return tenant_full(n)
end
-- The run's fields that come and go (its latest error, output, the resolution its waiters
-- receive, its wait, its progress): charged at their size when set (`move`,
-- `blob_delta`), the old value given back; dropped with `drop_blobs`.
local BLOBS = { error = true, output = true, resolution = true, wait = true, progress = true }
-- A run's hash stays packed (a listpack) while no value is longer than PACKED_MAX
-- (Redis's hash-max-listpack-value); the first longer value makes it a hash table for
-- good, which costs UNPACK more. `up` marks a run charged for that. Returns what setting
-- `fields` (flat name/value list) adds for it.
local PACKED_MAX, UNPACK = 64, @UNPACK@
local function unpack_cost(id, fields)
  for i = 2, #fields, 2 do
    if #fields[i] > PACKED_MAX then
      local rk = runkey(id)
      if rcall('HEXISTS', rk, 'up') == 1 then return 0 end
      rcall('HSET', rk, 'up', '1')
      return UNPACK
    end
  end
  return 0
end
-- The stored length of blob `f` of run `id`: from `lens` (lengths the caller read with
-- the run, by field) when it has it, else read.
local function blob_len(id, f, lens)
  local n = lens and lens[f]
  if n then return n end
  return rcall('HSTRLEN', runkey(id), f)
end
-- What setting `fields` on run `id` adds to its bytes.
local function blob_delta(id, fields, lens)
  local d = 0
  for i = 1, #fields, 2 do
    if BLOBS[fields[i]] then
      d = d + mem(#fields[i + 1]) - mem(blob_len(id, fields[i], lens))
    end
  end
  return d + unpack_cost(id, fields)
end
-- A settings version (`sets`: version → the function's settings blob, shared by the
-- runs that pin it): its entry besides the blob.
local C_SET = @SET_COST@
local function set_cost(n) return C_SET + mem(n) end
-- A settings version names the function's component and settings together (a content
-- hash of `digest\nsettings`, whose blob `sets` keeps under it): a run pins both with
-- its 16 bytes instead of carrying the 64-hex digest too. A function's `svd` marks its
-- `sv` as such a version; runs pinning one have no `digest` field (those of versions
-- before it do, and runs from before versions a `settings` blob).
local function version_of(digest, settings)
  local blob = digest .. '\n' .. settings
  return string.sub(redis.sha1hex(blob), 1, 16), blob
end
-- The component a version's blob names (nil for a version from before those, whose blob
-- is the settings JSON alone).
local function version_digest(blob)
  return string.match(blob, '^([^{\n][^\n]*)\n')
end
-- The settings version of function key `fk`, adopted for a function deployed before
-- versions named its component: its blob is stored in `sets` under its version. (The
-- settings and digest are read only then: a batch or an event checks the version at
-- every call.)
local function settings_version(fk)
  local v = rcall('HMGET', fk, 'sv', 'svd')
  if v[2] then return v[1] end
  local f = rcall('HMGET', fk, 'settings', 'digest')
  if not f[1] then return v[1] end
  local sv, blob = version_of(f[2], f[1])
  if rcall('HSETNX', KSETS, sv, blob) == 1 then charge(nil, set_cost(#blob)) end
  rcall('HSET', fk, 'sv', sv, 'svd', '1')
  return sv
end
-- The `rdig` field a run pins its component and settings version by: `|sv` for a
-- version that names the component, `digest|sv` for one before those, the digest alone
-- for a run from before versions.
local function pin(digest, sv)
  if not digest then return '|' .. sv end
  if sv then return digest .. '|' .. sv end
  return digest
end
local function drop_blobs_known(id, lens, fields)
  local d = 0
  for _, f in ipairs(fields) do
    if BLOBS[f] then d = d - mem(blob_len(id, f, lens)) end
  end
  charge(id, d)
  rcall('HDEL', runkey(id), unpack(fields))
end
local function drop_blobs(id, ...) drop_blobs_known(id, nil, { ... }) end

-- An event id is kept twice (the dedup hash and its time index).
local function event_cost(eid) return C_EVENT + 2 * #eid end
-- Forgets up to `limit` event ids past their dedup window, giving back what they cost.
local function forget_events(limit)
  for _, old in ipairs(rcall('ZRANGEBYSCORE', P .. 'evz', '-inf', NOW - WINDOW, 'LIMIT', 0, limit)) do
    rcall('ZREM', P .. 'evz', old)
    rcall('HDEL', P .. 'events', old)
    charge(nil, -event_cost(old))
  end
end
local TERMINAL = { succeeded = true, failed = true, cancelled = true, skipped = true }

-- A run as replies carry it: the values of RUN_FIELDS (decode.rs), in order. Without its
-- last field, output, when the caller already has it.
local RUN_FIELDS = { @RUN_FIELDS@ }
-- RUN_AT: where each of RUN_FIELDS is in a run_fields reply. (Built with a plain loop: a
-- library's load sees no `ipairs` or `unpack`, only its calls do.)
local RUN_AT = {}
for i = 1, #RUN_FIELDS do RUN_AT[RUN_FIELDS[i]] = i end
-- A queued run is mostly its input, and its hash must stay packed (no value longer than
-- PACKED_MAX). An input of up to PACKED_MAX bytes is the field `input`; one of up to
-- CHUNKS pieces of PACKED_MAX bytes is kept in the hash as those pieces (`in1`, `in2`,
-- ...: about 8 bytes each beyond the input, where a key of its own costs about 100); a
-- longer one beside the hash, in `in:<id>` (and so are those of runs written before the
-- pieces).
local CHUNKS = 8
local CHUNK_NAMES = { 'in1', 'in2', 'in3', 'in4', 'in5', 'in6', 'in7', 'in8' }
local function inkey(id) return P .. 'in:' .. id end
-- How many pieces an input of `len` bytes is kept in: 0 for one short enough to be the
-- `input` field, nil for one kept in `in:<id>`.
local function pieces_of(len)
  if len <= PACKED_MAX then return 0 end
  local n = math.ceil(len / PACKED_MAX)
  if n > CHUNKS then return nil end
  return n
end
-- Appends to `fields` (a flat name/value list) the pieces of `input`, when it is kept so;
-- false when it is not.
local function input_pieces(input, fields)
  local n = pieces_of(#input)
  if not n then return false end
  for i = 1, n do
    fields[#fields + 1] = CHUNK_NAMES[i]
    fields[#fields + 1] = string.sub(input, (i - 1) * PACKED_MAX + 1, i * PACKED_MAX)
  end
  return true
end
-- The input its pieces make (`piece(i)`: the i-th or nil/false), nil when there are none.
local function joined(piece)
  if not piece(1) then return nil end
  local parts = {}
  for i = 1, CHUNKS do
    local p = piece(i)
    if not p then break end
    parts[i] = p
  end
  return table.concat(parts)
end
-- Fills the run's input into `fields` (a run_fields reply of run `id`, status included)
-- when the hash has no `input` field, and the run's id and tenant, which its key names
-- (runs written before kept them in the hash too). `r`: the run's whole hash by field,
-- when the caller read it (a claim), so that its pieces need no read.
local function with_input(id, fields, r)
  if fields[RUN_AT.status] then
    fields[RUN_AT.id], fields[RUN_AT.tenant] = id, TENANT
    if not fields[RUN_AT.input] then
      local input
      if r then
        input = joined(function(i) return r[CHUNK_NAMES[i]] end)
      else
        local c = rcall('HMGET', runkey(id), unpack(CHUNK_NAMES))
        input = joined(function(i) return c[i] end)
      end
      fields[RUN_AT.input] = input or rcall('GET', inkey(id))
    end
  end
  return fields
end
local function run_fields(id, without_output)
  local n = #RUN_FIELDS
  if without_output then n = n - 1 end
  return with_input(id, rcall('HMGET', runkey(id), unpack(RUN_FIELDS, 1, n)))
end

-- A run's hash as a table by field name, read whole (one HGETALL). A claim reads it so:
-- a packed hash answers an HMGET of many fields one scan per field, HGETALL in one.
local function run_hash(id)
  local h = rcall('HGETALL', runkey(id))
  -- Made with slots for the fields a run's hash mostly has: a table that grows one key at
  -- a time is rehashed at every power of two.
  local r = { status = nil, sbytes = nil, created_at = nil, nosteps = nil, due_at = nil,
    ['function'] = nil, sv = nil, max_attempts = nil, input = nil, attempt = nil,
    lease_token = nil, updated_at = nil, trigger = nil, qu = nil, cgate = nil,
    resumed = nil }
  for i = 1, #h, 2 do r[h[i]] = h[i + 1] end
  return r
end

-- A run's steps: their outputs in `steps:<id>` by field, their order (entries
-- `attempt|completed_at|field`) in `stepseq:<id>` — but for the first step's entry, which
-- its step hash holds as FIRST_STEP (no step's field: those begin with an occurrence and
-- a colon). A run of one step, most runs with any, so has one key of its own for its
-- steps, not two: an RPUSH that makes a key (~8k instructions) and ~185 bytes fewer.
-- (The first steps of runs from before 2026-12-07 are in the list.)
local FIRST_STEP = '#'

-- Run `id`'s step order from entry `from` (0-based), `n` entries (nil: to the end), and
-- how many of them its step hash holds (FIRST_STEP: 0 or 1).
local function step_order(id, from, n)
  local first = rcall('HGET', P .. 'steps:' .. id, FIRST_STEP)
  local off = first and 1 or 0
  local out = {}
  if first and from == 0 and (not n or n > 0) then
    out[1] = first
    if n then n = n - 1 end
  end
  if not n or n > 0 then
    local lo = math.max(from - off, 0)
    local hi = -1
    if n then hi = lo + n - 1 end
    for _, e in ipairs(rcall('LRANGE', P .. 'stepseq:' .. id, lo, hi)) do out[#out + 1] = e end
  end
  return out, off
end

-- The output sizes of run `id`'s step order entries `steps` (as step_order gives them).
local function step_sizes(id, steps)
  local sk, sizes = P .. 'steps:' .. id, {}
  for i, e in ipairs(steps) do
    sizes[i] = rcall('HSTRLEN', sk, string.match(e, '^[^|]*|[^|]*|(.*)$'))
  end
  return sizes
end

-- Appends a claimed run and its steps to the claim's reply `out`: `fields` (its
-- run_fields as the claim has them, one table), its lease's `memo` (a string the store
-- hands back with the end: see finish.lua), then the count and entries of its step
-- order, then of its inlined outputs (name, output pairs), flat; the claim packs `out`
-- (cmsgpack) into its reply. (Flat from when the reply went out as RESP, which probed
-- every table for seven special fields, ~3k instructions each; `fields` stays a table:
-- copying its values cost more.)
-- `nosteps`: the run's `nosteps` flag (set at creation, cleared by its first step), so a
-- run without steps costs no reads of its step keys. Step outputs come along while they
-- fit in INLINE bytes; the rest by reference.
local function append_run(out, id, nosteps, fields, memo)
  local n = #out + 2
  out[n - 1], out[n] = fields, memo
  if nosteps then
    out[n + 1], out[n + 2] = 0, 0
    return
  end
  local sk = P .. 'steps:' .. id
  local order = step_order(id, 0)
  out[n + 1] = #order
  for i, e in ipairs(order) do out[n + 1 + i] = e end
  n = n + 1 + #order
  local outs, budget = {}, INLINE
  for _, e in ipairs(order) do
    local field = string.match(e, '^[^|]*|[^|]*|(.*)$')
    local len = rcall('HSTRLEN', sk, field)
    if len <= budget then
      budget = budget - len
      outs[#outs + 1] = field
      outs[#outs + 1] = rcall('HGET', sk, field)
    end
  end
  out[n + 1] = #outs
  for i, v in ipairs(outs) do out[n + 1 + i] = v end
end

-- Named queues (wasq_core::queues): the default queue's lane is `q`, queue X's `q:X`; a
-- run of queue X has `qu` = X (absent: default). `queues` holds the tenant's other queues
-- (it only grows: a deploy names them, so it stays small).
local function lane(q)
  if not q then return KQ end
  return named_key(KLANES, 'q:', q)
end

-- The tenant's queues besides the default one, read once per call.
local QLIST
local function other_queues()
  if not QLIST then QLIST = rcall('SMEMBERS', KQUEUES) end
  return QLIST
end

-- Runs that entered a lane due now in this call, by queue ('' = default): the wake-ups
-- `publish` sends to the workers of that queue. `TAKES`: this call takes runs out of the
-- lanes too (a claim), so a run it added may be gone again.
local LANEADD, TAKES

-- The earliest score of each maintenance zset (`ready`, `leases`, `timeouts`, `gtimer`) as
-- this call read it (false: empty; absent: not read), so that `publish` need not read it
-- again: a claim reads all four first. Writes keep it at or before the truth, never after:
-- a ZADD (zadd_maint) lowers it, a ZREM leaves it. A due time published too early costs a
-- visit that finds nothing; one too late would leave runs waiting.
local HEADS
-- The earliest score this call added to any of those zsets (nil: none): `publish` knows
-- the tenant's due time cannot have come earlier than one it published when none is
-- earlier than it.
local MINADD

-- The last score zadd_maint converted, and its number: a claim's leases share one
-- expiry, and `tonumber` costs a strtod.
local LASTS, LASTN

-- Notes that maintenance zset `key` got a member at `score` (a string) in this call.
local function noted_maint(key, score)
  if score ~= LASTS then LASTS, LASTN = score, tonumber(score) end
  if not MINADD or LASTN < MINADD then MINADD = LASTN end
  local h = HEADS[key]
  if h ~= nil and (h == false or LASTN < h) then HEADS[key] = LASTN end
end

-- ZADD key [opt] score id (`score` a string, as Redis takes it).
local function zadd_maint(key, score, id, opt)
  if opt then
    zflush(key)
    rcall('ZADD', key, opt, score, id)
  else
    zadd1(key, score, id)
  end
  noted_maint(key, score)
end

-- The earliest score of maintenance zset `key`, read; false when it has none (the pin
-- of `leases`, at +inf, is none).
local function head_of(key)
  local h = rcall('ZRANGE', key, '0', '0', 'WITHSCORES')
  local s = h[2] and tonumber(h[2])
  if not s or s == math.huge then return false end
  return s
end

-- How many runs hold a lease (the pin left out), stale entries included.
local function leased()
  return rcall('ZCOUNT', KLEASES, '-inf', '(+inf')
end

-- The members of maintenance zset `key` due now, at most `limit`; notes its head.
local function due_members(key, limit)
  local s = head_of(key)
  if not s then
    HEADS[key] = false
    return {}
  end
  if s > NOW then
    HEADS[key] = s
    return {}
  end
  HEADS[key] = nil
  return rcall('ZRANGEBYSCORE', key, '-inf', NOWS, 'LIMIT', '0', limit)
end

-- A named queue's queued and running runs (`qload`: `<queue>|queued`, `<queue>|running`);
-- the default queue's are the rest of the tenant's (queued_count, `leases`).
local function queue_load(q, status, n)
  if status == 'queued' or status == 'running' then
    rcall('HINCRBY', P .. 'qload', q .. '|' .. status, n)
  end
end

local function lane_add(q, score, id)
  zadd1(lane(q), score, id)
  local k = q or ''
  LANEADD[k] = (LANEADD[k] or 0) + 1
end

-- The tenant's feed (wasq_core::feed): the status changes of this call (run id, status),
-- appended to the `feed` stream by `leave` while a listener keeps `meta.feed` (a time)
-- ahead of now. `FEEDUNTIL`: that time as this call read it (`publish` reads it with its
-- own fields; nil: not read yet, false: not set).
local FEEDQ, FEEDUNTIL

local function feed_note(id, status)
  FEEDQ[#FEEDQ + 1] = id
  FEEDQ[#FEEDQ + 1] = status
end

local function flush_feed()
  if #FEEDQ == 0 then return end
  if FEEDUNTIL == nil then FEEDUNTIL = tenant_meta()[3] end
  if not FEEDUNTIL or tonumber(FEEDUNTIL) < NOW then return end
  for i = 1, #FEEDQ, 2 do
    local id = FEEDQ[i]
    local h = rcall('HMGET', runkey(id), 'function', 'attempt')
    rcall('XADD', P .. 'feed', 'MAXLEN', '~', '@FEED_KEEP@', '*', 'r', id, 'f', h[1] or '',
      's', FEEDQ[i + 1], 'a', h[2] or '0', 't', NOWS)
  end
end

-- Flow control (see lib.rs): due runs wait in their lane (`q`, `q:<queue>`) by rank; a run its gate holds
-- back is parked in `park:<gate>` (same rank) until the gate lets it back into the lane.
local function unpark(id, score)
  lane_add(rcall('HGET', runkey(id), 'qu') or nil, score, id)
  rcall('HDEL', runkey(id), 'parked')
end

-- `q`: the run's queue (`qu`), nil for the default one.
local function park(id, gate, score, q)
  rcall('ZREM', lane(q), id)
  rcall('ZADD', P .. 'park:' .. gate, score, id)
  charge(id, unpack_cost(id, { 'parked', gate }))
  rcall('HSET', runkey(id), 'parked', gate)
end

-- A slot of a concurrency key freed: its best parked run goes back into the lane.
local function unpark_one(gate)
  local p = rcall('ZPOPMIN', P .. 'park:' .. gate, 1)
  if p[1] then unpark(p[1], p[2]) end
end

-- The fields `move` reads first, in this order; a caller that read them already (the
-- first MOVE_FIELDS elements of its HMGET) passes them as `pre`.
local MOVE_FIELDS = { 'status', 'created_at', 'wait_event', 'wait_run', 'cgate', 'parked', 'qu' }

-- Moves run `id` to `status`, setting `fields` (flat name/value list) and updated_at, and
-- keeps every index in step: status index, ready/lane/park/lease/timeout zsets, waiter
-- sets, running sets of concurrency keys. Waiting runs get their waiter-set
-- and timeout entries from the caller. A run is only taken out of the indexes its old
-- status puts it in: queued and sleeping runs are in `ready` or `q` (or parked), running
-- runs in `leases`, waiting runs in `timeouts` and their waiter set; entries an index
-- keeps after a run left its status are dropped by the claim that meets them.
-- `from`: the lane a claim took the run from (then it is in no other lane, nor in `ready`).
-- `fname`: the run's function, when the caller read it (reindex needs it for a move into
-- or out of `queued`).
-- `lens`: NOBLOB when `fields` set no blob and no value over PACKED_MAX (a claim's lease),
-- so that they are not looked through.
-- `expires`: a claim's lease expiry. A lease is not kept in the run's hash: its expiry is
-- the run's score in `leases`, its worker in the open execution (`att:`), and its token
-- (`lease_token`, the fence) alone in the hash; the two fields a claim wrote and an end
-- deleted cost both a scan of the packed hash per field (an older wasq's running runs
-- still have them: nothing reads them but `lease_holder`).
-- `sbase`: the run's `sbytes` as this call read it, when the caller did: what this call
-- charged the run so far is then written with the move's HSET, not by an HINCRBY of its
-- own when the call returns.
local NOBLOB = {}
local function move(id, status, fields, pre, lens, from, fname, expires, sbase)
  local rk = runkey(id)
  local r = pre or rcall('HMGET', rk, unpack(MOVE_FIELDS))
  local old, created, cgate = r[1], r[2], r[5]
  if old ~= status then
    if not fname and (old == 'queued' or status == 'queued' or not old) then
      fname = rcall('HGET', rk, 'function')
    end
    reindex(id, fname, old, status, created)
    if r[7] then queue_load(r[7], old, -1); queue_load(r[7], status, 1) end
    feed_note(id, status)
  end
  if from then
    zrem1(from, id)
  elseif old == 'queued' or old == 'sleeping' then
    zrem1(KREADY, id)
    zrem1(lane(r[7] or nil), id)
  elseif old == 'running' then
    zrem1(KLEASES, id)
  elseif old == 'waiting' then
    zrem1(KTIMEOUTS, id)
    if r[3] then rcall('SREM', P .. 'waiters:' .. r[3], id) end
    if r[4] then rcall('SREM', P .. 'rw:' .. r[4], id) end
  elseif KENDED[old] then
    -- An ended run an older wasq also indexed by finish time (`ended:ok`, `ended:bad`,
    -- which a tenant's first purge since drops): out of there too while they last.
    zrem1(KENDED[old], id)
  end
  if r[6] then
    rcall('ZREM', P .. 'park:' .. r[6], id)
    rcall('HDEL', rk, 'parked')
  end
  if lens ~= NOBLOB then charge(id, blob_delta(id, fields, lens)) end
  if sbase then
    local d = RDELTA[id]
    if d and d.sbytes then
      fields[#fields + 1], fields[#fields + 2] = 'sbytes', I(sbase + d.sbytes)
      d.sbytes = nil
    end
  end
  rcall('HSET', rk, 'status', status, 'updated_at', NOWS, unpack(fields))
  if status == 'queued' or status == 'sleeping' then
    local h = rcall('HMGET', rk, 'due_at', 'rank_offset', 'qu')
    local due = tonumber(h[1])
    if due <= NOW then
      lane_add(h[3] or nil, I(due + tonumber(h[2] or '0')), id)
    else
      zadd_maint(KREADY, h[1], id)
    end
  elseif status == 'running' then
    if not PINNED and not ZB then
      -- The pin rides in the lease's ZADD: a claim of one run (a queue that keeps up)
      -- sends one command for both.
      rcall('ZADD', KLEASES, '+inf', LEASE_PIN, expires, id)
      noted_maint(KLEASES, expires)
    else
      if not PINNED then zadd1(KLEASES, '+inf', LEASE_PIN) end
      zadd_maint(KLEASES, expires, id)
    end
    PINNED = true
  end
  if cgate and old ~= status then
    if status == 'running' then
      rcall('SADD', P .. 'crun:' .. cgate, id)
    elseif old == 'running' then
      rcall('SREM', P .. 'crun:' .. cgate, id)
      unpark_one(cgate)
    elseif TERMINAL[status] and not r[6] then
      -- A candidate for a slot is gone: let the next one try.
      unpark_one(cgate)
    end
  end
end

-- The worker holding run `id`'s lease: its open execution's (the last of its attempts
-- list, `number|started_at|worker JSON`); '' when there is none.
local function lease_holder(id)
  local last = rcall('LINDEX', P .. 'att:' .. id, '-1')
  local json = last and string.match(last, '^[^|]*|[^|]*|([^\n]*)$')
  if not json then return '' end
  local ok, name = pcall(cjson.decode, json)
  if ok and type(name) == 'string' then return name end
  return ''
end

-- Ends the run's latest execution (the last element of its attempts list). `open`: that
-- element as the caller knows it (a lease's memo), nil to read it.
local function close_attempt(id, err, fuel, suspended, open)
  local ak = P .. 'att:' .. id
  local last = open
  if not last then
    last = rcall('LINDEX', ak, '-1')
    if not last then return end
    last = string.match(last, '^[^\n]*')
  end
  rcall('LSET', ak, '-1', last .. '\n' .. NOWS .. '|' .. fuel .. '|' .. suspended .. '|' .. err)
  -- Never refused: a run over its quota must still be able to fail.
  charge(id, #err)
end

-- What a new step costs: its field twice (the hash and its order entry) and its output;
-- the run's first step creates the step hash, the first later one the order list, which
-- write_step charges when its RPUSH made it. `first`: whether it is the run's first step,
-- nil to read it (the run still has `nosteps`). `room`: the cost a check of room counts
-- before the step is stored, which for a later step includes the list's key (the check
-- does not read whether the list is there: at most one key's bytes too strict).
local function step_cost(id, field, output, first, room)
  if first == nil then first = rcall('HGET', runkey(id), 'nosteps') == '1' end
  local c = C_STEP + 2 * #field + mem(#output)
  if first or room then c = c + KEY end
  return c
end

-- Stores a step output; the first write wins. A caller that knows already that the step
-- is not stored passes `first`: whether it is the run's first step (the run still has
-- `nosteps`), true or false; nil makes this read both (a finish knows them: two commands
-- fewer per step). The first step clears `nosteps` (deletes it), unless `flag_later`:
-- the caller sets it to '0' with the other fields it writes (a finish, in its
-- transition's HSET: a command fewer). Only '1' means no steps.
local function write_step(id, field, output, attempt, first, flag_later)
  local sk = P .. 'steps:' .. id
  if first == nil then
    if rcall('HEXISTS', sk, field) == 1 then return end
    first = rcall('HGET', runkey(id), 'nosteps') == '1'
  end
  charge(id, step_cost(id, field, output, first))
  local entry = attempt .. '|' .. NOWS .. '|' .. field
  if first then
    rcall('HSET', sk, field, output, FIRST_STEP, entry)
  else
    rcall('HSET', sk, field, output)
    if rcall('RPUSH', P .. 'stepseq:' .. id, entry) == 1 then charge(id, KEY) end
  end
  if first and not flag_later then rcall('HDEL', runkey(id), 'nosteps') end
end

-- Appends log lines (ARGV[first..last], to the end when `last` is nil) while the run's
-- log budget (max_run_log_bytes) and the tenant's room last; past either, the marker line
-- Rust made for that case, once, and nothing after it (`lcut`).
local function append_logs(id, first, mrun, mtenant, last)
  last = last or #ARGV
  if first > last then return end
  local rk = runkey(id)
  local r = rcall('HMGET', rk, 'lbytes', 'lcut')
  if r[2] == '1' then return end
  local used = tonumber(r[1] or '0') + pending(id, 'lbytes')
  local rmax, tmax = quota('max_run_log_bytes'), quota('max_stored_bytes')
  local tused = stored()
  local added, cut = 0, nil
  -- The run's first line creates its list.
  local key = 0
  if rcall('EXISTS', P .. 'logs:' .. id) == 0 then key = KEY end
  for i = first, last do
    local c = C_LOG + #ARGV[i] + key
    if rmax and used + added + c > rmax then cut = mrun
    elseif tmax and tused + added + c > tmax then cut = mtenant end
    if cut then break end
    rcall('RPUSH', P .. 'logs:' .. id, ARGV[i])
    added = added + c
    key = 0
  end
  if cut then
    rcall('RPUSH', P .. 'logs:' .. id, cut)
    rcall('HSET', rk, 'lcut', '1')
    added = added + C_LOG + #cut + key
  end
  charge(id, added, 'lbytes')
end

-- Ends a wait: the resolution becomes the waiting step's output and the run is due now as
-- a resume of its current attempt.
local function resolve_wait(id, resolution)
  local rk = runkey(id)
  local r = rcall('HMGET', rk, 'wait_step', 'attempt')
  write_step(id, r[1], resolution, r[2])
  move(id, 'sleeping', { 'due_at', NOWS })
  drop_blobs(id, 'wait', 'wait_event', 'wait_run', 'wait_step', 'wait_ver')
end

-- After run `id` ended: the runs waiting for it resume with its resolution. Returns how
-- many resumed.
local function resolve_waiters_of(id)
  local wk = P .. 'rw:' .. id
  local ws = rcall('SMEMBERS', wk)
  if #ws == 0 then return 0 end
  local res = rcall('HGET', runkey(id), 'resolution')
  if not res then return 0 end
  local n = 0
  for _, w in ipairs(ws) do
    local r = rcall('HMGET', runkey(w), 'status', 'wait_run')
    if r[1] == 'waiting' and r[2] == id then
      resolve_wait(w, res)
      n = n + 1
    end
  end
  rcall('DEL', wk)
  return n
end

-- resolve_waiters_of for each of `ids`, after one look for any waiter of them all (an
-- end nearly never has one). Returns how many resumed.
local function resolve_waiters_of_all(ids)
  if #ids == 0 then return 0 end
  local any = false
  for i = 1, #ids, ZCHUNK do
    local keys = {}
    for j = i, math.min(i + ZCHUNK - 1, #ids) do keys[#keys + 1] = P .. 'rw:' .. ids[j] end
    if rcall('EXISTS', unpack(keys)) > 0 then
      any = true
      break
    end
  end
  if not any then return 0 end
  local n = 0
  for _, id in ipairs(ids) do n = n + resolve_waiters_of(id) end
  return n
end

-- A transition computed by wasq_core::lifecycle (T_ARGS arguments from ARGV[i], see
-- transition.rs); nil when ARGV[i] is '' (none sent).
local function read_transition(i)
  if ARGV[i] == '' then return nil end
  -- A success as an end sends it: 'S' and its own six values (SUCCESS in transition.rs).
  if ARGV[i] == @SUCCESS@ then
    return {
      status = 'succeeded', errmode = 'c', err = '', hasout = '1', out = ARGV[i + 1],
      due = '', fin = ARGV[i + 2], giveback = '0', exec = 'close', eerr = '',
      efuel = ARGV[i + 3], esusp = '', res = ARGV[i + 4], uexec = ARGV[i + 5],
      ufuel = ARGV[i + 6], clearcancel = '0',
    }
  end
  return {
    status = ARGV[i], errmode = ARGV[i + 1], err = ARGV[i + 2], hasout = ARGV[i + 3],
    out = ARGV[i + 4], due = ARGV[i + 5], fin = ARGV[i + 6], giveback = ARGV[i + 7],
    exec = ARGV[i + 8], eerr = ARGV[i + 9], efuel = ARGV[i + 10], esusp = ARGV[i + 11],
    res = ARGV[i + 12], uexec = ARGV[i + 13], ufuel = ARGV[i + 14],
    clearcancel = ARGV[i + 15],
  }
end

-- Writes transition `t` of run `id`: its history, its tenant's usage, its hash and every
-- index (`move`, which takes `pre`, `extra` fields and the blobs' `lens`). It decides
-- nothing: whatever the transition says is stored. Returns whether the run is now
-- claimable at once. `sbase`: see `move`. A field the transition drops is only deleted
-- when it may be there: `lens` (the caller read the run) says which blobs are not, and
-- `lens.finished_at` = 0 that the run has no finish time (a running run: only terminal
-- runs have one, as every transition out of those drops it) — so an end that succeeds
-- deletes nothing. `open`: the run's open execution, when the caller knows it.
local function may_have(lens, f) return not (lens and lens[f] == 0) end
-- Counts an execution the transition says ended (`uexec` '1') in the tenant's usage, with
-- its fuel ('' when unknown).
local function count_execution(uexec, ufuel)
  if uexec == '1' then
    UEXEC = UEXEC + 1
    if ufuel ~= '' then UFUEL = UFUEL + tonumber(ufuel) end
  end
end
local function apply(id, t, pre, extra, lens, sbase, open)
  local rk = runkey(id)
  if t.exec == 'close' then
    close_attempt(id, t.eerr, t.efuel, t.esusp, open)
  elseif t.exec == 'drop' then
    local att = rcall('RPOP', P .. 'att:' .. id)
    if att then
      local worker = string.match(att, '^[^|]*|[^|]*|(.*)$') or ''
      charge(id, -(C_ATT + #worker))
    end
  end
  count_execution(t.uexec, t.ufuel)
  -- Without `lens` (a run not read first) the lease fields an older wasq kept in the hash
  -- go too.
  local fields, gone = extra or {}, {}
  if not lens then gone = { 'lease_expires_at', 'worker' } end
  -- (Appended in line: a closure made per call to append them cost more than the rest.)
  local n = #fields
  if t.errmode == 's' then
    fields[n + 1], fields[n + 2], n = 'error', t.err, n + 2
  elseif t.errmode == 'c' and may_have(lens, 'error') then
    gone[#gone + 1] = 'error'
  end
  if t.hasout == '1' then fields[n + 1], fields[n + 2], n = 'output', t.out, n + 2 end
  if t.due ~= '' then fields[n + 1], fields[n + 2], n = 'due_at', t.due, n + 2 end
  if t.fin ~= '' then
    fields[n + 1], fields[n + 2], n = 'finished_at', t.fin, n + 2
  elseif may_have(lens, 'finished_at') then
    gone[#gone + 1] = 'finished_at'
  end
  if t.res ~= '' then
    fields[n + 1], fields[n + 2], n = 'resolution', t.res, n + 2
  elseif may_have(lens, 'resolution') then
    gone[#gone + 1] = 'resolution'
  end
  if t.clearcancel == '1' then fields[n + 1], fields[n + 2], n = 'cancel_requested', '0', n + 2 end
  if t.giveback == '1' then
    fields[n + 1], fields[n + 2] = 'attempt', I(tonumber(rcall('HGET', rk, 'attempt')) - 1)
  end
  -- The dropped blobs are given back before the move writes what the run is charged.
  if #gone > 0 then drop_blobs_known(id, lens, gone) end
  move(id, t.status, fields, pre, lens, nil, nil, nil, sbase)
  return (t.status == 'queued' or t.status == 'sleeping')
    and tonumber(rcall('HGET', rk, 'due_at')) <= NOW
end

-- The sliding window of a throttle or rate limit (`win:<gate>`, newest first, at most
-- `limit` entries): the time it opens when `limit` entries fall in the last `period`,
-- nil when there is room.
local function window_full(gate, limit, period)
  local t = rcall('LINDEX', P .. 'win:' .. gate, limit - 1)
  if t and tonumber(t) > NOW - period then return tonumber(t) + period end
  return nil
end

local function window_log(gate, limit)
  rcall('LPUSH', P .. 'win:' .. gate, NOWS)
  rcall('LTRIM', P .. 'win:' .. gate, 0, limit - 1)
end

-- admission.lua (read_flow, insert_run) comes after this prelude and publish.lua.

-- publish.lua (has_room, next_due, publish, publish_added) comes after this prelude.

local function check_lease(id, token)
  local r = rcall('HMGET', runkey(id), 'status', 'lease_token')
  if not r[1] then return 'not_found' end
  if r[1] ~= 'running' or r[2] ~= token then return 'lease_lost' end
  return nil
end

-- Starts a call: its arguments, and nothing left over from the call before (one that
-- failed halfway never reached `leave`).
local function enter(args)
  if not rcall then
    fill_builtins()
    -- Lua's collector starts a cycle when its heap has grown to twice what the last one
    -- kept (pause 200): every call leaves garbage (replies, tables, key names), and the
    -- heap the library keeps is small (about 460 KiB with the garbage, measured). At 4×
    -- it collects half as often: 1.1-1.7% fewer instructions per run (10× gained no
    -- more: Redis itself steps the collector every 50 calls). The setting is the whole
    -- functions engine's (every library on this Redis). Guarded: a Redis that denies
    -- scripts `collectgarbage` keeps its own pace.
    pcall(function() collectgarbage('setpause', 400) end)
  end
  ARGV, P, G, NOW, TENANT = args, args[1], args[2], tonumber(args[3]), args[4]
  NOWS = args[3]
  KEY = @KEY_COST@ + #P
  QUOTAS, METAH = nil, nil
  TDELTA, RDELTA, UEXEC, UFUEL, NQDELTA, USED = 0, {}, 0, 0, 0, nil
  QLIST, LANEADD, TAKES, HEADS, MINADD, PINNED, RK = nil, {}, false, {}, nil, false, {}
  ZB, ZBK, ZBADD, ZALT, FNS, PINS = nil, nil, nil, nil, nil, nil
  FEEDQ, FEEDUNTIL = {}, nil
  if P ~= KP then
    KP = P
    KQ, KREADY, KLEASES, KUSAGE = P .. 'q', P .. 'ready', P .. 'leases', P .. 'usage'
    KMETA, KQUOTAS, KTIMEOUTS, KGTIMER = P .. 'meta', P .. 'quotas', P .. 'timeouts', P .. 'gtimer'
    KENDED = { succeeded = P .. 'ended:ok', skipped = P .. 'ended:ok', failed = P .. 'ended:bad',
      cancelled = P .. 'ended:bad' }
    KRDIG = P .. 'rdig'
    KSETS, KTCFG, KDEB, KST, KQFN, KBYFN = P .. 'sets', P .. 'tcfg', P .. 'deb', {}, {}, {}
    KQUEUES, KLANES, KNQ = P .. 'queues', {}, P .. 'nq'
  end
end

-- Ends a call: writes what it charged, and answers `reply`.
local function leave(reply)
  zflush()
  settle_charges()
  flush_feed()
  return reply
end
