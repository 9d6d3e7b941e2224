-- Runs of the tenant, each admitted or refused on its own, in order (Queue::enqueue: the
-- store sends the enqueues that arrive while its previous call is on its way together,
-- see coalesce.rs). ARGV[5]: how many; then per run: id, function, input, trigger, the
-- settings version Rust computed the flow from; then 'P' and the cap factor for a run
-- with nothing else set and a plain flow (PLAIN_RUN in admission.rs), or its due time,
-- idempotency key, retry, max_attempts, trace, parent and flow (read_flow_at).
-- The reply, flat after `ok` and the publish: each run's answer's length, then its
-- values: `ok`, created, the stored run's fields or false, then a new queued run's `made`
-- (status, due, digest, max_attempts, sbytes); or a refusal (`not_found`, `stale`,
-- `quota` or a storage reply), which changed nothing. (Each table in a reply costs Redis
-- ~3k instructions to convert: see append_run.)
local out, n, wake, any, added = { 'ok', false }, 2, 0, false, true
-- The runs' index writes go out together (zdefer).
zdefer(tonumber(ARGV[5]), true)
local o = 6
for _ = 1, tonumber(ARGV[5]) do
  local due, idem, retry, rmax, trace, parent, fl, after = '', '', '', '', '', ''
  if ARGV[o + 5] == @PLAIN_RUN@ then
    fl, after = plain_flow(ARGV[o + 6]), o + 7
  else
    due, idem, retry, rmax, trace, parent = ARGV[o + 5], ARGV[o + 6], ARGV[o + 7],
      ARGV[o + 8], ARGV[o + 9], ARGV[o + 10]
    fl, after = read_flow_at(o + 11)
  end
  local id, created, err, woke, made = insert_run(ARGV[o], ARGV[o + 1], ARGV[o + 2],
    ARGV[o + 3], due, idem, retry, rmax, parent, trace, ARGV[o + 4], fl)
  o = after
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
