-- Runs of one function, all or nothing (wasq_core::Queue::enqueue_batch): everything
-- that could refuse one run is checked for the whole batch first — the function and the
-- version of its settings, each debounce key Rust read, max_queued (every run counts:
-- wasq_core::lifecycle::admit_batch), the storage quotas against what the runs cost
-- together — so the inserts that follow cannot be refused halfway.
local FNAME, SV, TRIGGER, REPLACES_NEW, N = ARGV[5], ARGV[6], ARGV[7], ARGV[8], tonumber(ARGV[9])
-- Per run: id, input, due, idempotency key, retry, its max_attempts, trace, then the flow.
local stride = 7 + FLOW_ARGS
local fk = P .. 'fn:' .. FNAME
if not rcall('HGET', fk, 'digest') then return { 'not_found' } end
if (settings_version(fk) or '') ~= SV then return { 'stale' } end
local flows = {}
for i = 1, N do
  local fl = read_flow(10 + (i - 1) * stride + 7)
  if fl.dgate ~= '' and debounce_moved(fl) then return { 'stale' } end
  fl.enforce = '0'
  flows[i] = fl
end
local maxq = quota('max_queued')
if maxq and queued_count() + N > maxq then return { 'quota' } end
local cost = 0
local maxrun = quota('max_run_bytes')
for i = 1, N do
  local o = 10 + (i - 1) * stride
  local c = run_cost(ARGV[o + 1], TRIGGER, SV, ARGV[o + 3], ARGV[o + 4], flows[i], '', ARGV[o + 6])
  if maxrun and c > maxrun then return { 'storage', 'run', '0', I(c), I(maxrun), I(i) } end
  cost = cost + c
end
local full = tenant_full(cost)
if full then return full end
local wake = 0
-- The runs' index writes go out together (zdefer).
zdefer(N, true)
-- Per run, three elements: created (1/0), then either false and a created queued run's
-- `made` (Rust builds the run from its request) or the stored run's fields and false.
local out = { 'ok', false }
local ours = {}
for i = 1, N do
  local o = 10 + (i - 1) * stride
  local fl = flows[i]
  if fl.dgate ~= '' then
    local cur = rcall('HGET', KDEB, fl.dgate)
    if cur and ours[cur] then
      -- The key's pending run is one this batch created, which Rust could not read: a
      -- queued run that never started, whose fate core decided (REPLACES_NEW).
      local r = rcall('HMGET', runkey(cur), 'status', 'attempt')
      fl.dprev, fl.dver, fl.drep = cur, (r[1] or '') .. '|' .. (r[2] or ''), REPLACES_NEW
    end
  end
  local id, created, err, woke, made = insert_run(ARGV[o], FNAME, ARGV[o + 1], TRIGGER,
    ARGV[o + 2], ARGV[o + 3], ARGV[o + 4], ARGV[o + 5], '', ARGV[o + 6], SV, fl)
  if err then
    -- Checked above; a refusal here would leave the runs before it created.
    return redis.error_reply('enqueue_batch: run ' .. i .. ' refused after the checks: '
      .. tostring(type(err) == 'table' and err[1] or err))
  end
  if created then
    wake = wake + 1 + woke
    ours[id] = true
  end
  out[#out + 1] = created and 1 or 0
  if created and made[1] == 'queued' then
    out[#out + 1] = false
    out[#out + 1] = made
  else
    out[#out + 1] = run_fields(id)
    out[#out + 1] = false
  end
end
out[2] = publish(wake, false) or false
return out
