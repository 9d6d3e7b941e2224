-- Runs of the tenant, each admitted or refused on its own, in order (Queue::enqueue: the
-- store sends the enqueues that arrive while its previous call is on its way together,
-- see coalesce.rs). ARGV[5]: how many; then per run RUN_ARGS arguments: id, function,
-- input, trigger, due, idempotency key, retry, its max_attempts, trace, parent, the
-- settings version Rust computed the flow from, then the flow (FLOW_ARGS).
-- The reply, flat after `ok` and the publish: each run's answer's length, then its
-- values: `ok`, created, the stored run's fields or false, then a new queued run's `made`
-- (status, due, digest, max_attempts, sbytes); or a refusal (`not_found`, `stale`,
-- `quota` or a storage reply), which changed nothing. (Each table in a reply costs Redis
-- ~3k instructions to convert: see append_run.)
local RUN_ARGS = 11 + FLOW_ARGS
local out, n, wake, any, added = { 'ok', false }, 2, 0, false, true
-- The runs' index writes go out together (zdefer).
zdefer(tonumber(ARGV[5]), true)
for i = 1, tonumber(ARGV[5]) do
  local o = 6 + (i - 1) * RUN_ARGS
  local id, created, err, woke, made = insert_run(ARGV[o], ARGV[o + 1], ARGV[o + 2],
    ARGV[o + 3], ARGV[o + 4], ARGV[o + 5], ARGV[o + 6], ARGV[o + 7], ARGV[o + 9], ARGV[o + 8],
    ARGV[o + 10], read_flow(o + 11))
  if type(err) == 'table' then
    out[n + 1] = #err
    for j = 1, #err do out[n + 1 + j] = err[j] end
    n = n + 1 + #err
  elseif err then
    out[n + 1], out[n + 2] = 1, err
    n = n + 2
  else
    any, wake = true, wake + woke
    -- A new queued run: Rust builds it from its request and `made` (it is not read back).
    if created and made[1] == 'queued' then
      out[n + 1], out[n + 2], out[n + 3], out[n + 4] = 8, 'ok', 1, false
      for j = 1, 5 do out[n + 4 + j] = made[j] end
      n = n + 9
      if tonumber(made[2]) <= NOW then wake = wake + 1 else added = false end
    else
      out[n + 1], out[n + 2], out[n + 3], out[n + 4] = 3, 'ok', created and 1 or 0,
        run_fields(id)
      n = n + 4
      added = false
    end
  end
end
-- Only runs due now added: the cheaper publish (see publish_added).
if any then
  if added then out[2] = publish_added(wake) else out[2] = publish(wake, false) end
  out[2] = out[2] or false
end
return out
