local id, created, err, woke, made = insert_run(ARGV[5], ARGV[6], ARGV[7], ARGV[8], ARGV[9],
  ARGV[10], ARGV[11], ARGV[12], ARGV[14], ARGV[13], ARGV[15], read_flow(16))
if type(err) == 'table' then return err end
if err then return { err } end
local wake = woke
local pub
if created and made[1] == 'queued' and tonumber(made[2]) <= NOW then
  pub = publish_added(wake + 1)
else
  pub = publish(wake, false)
end
-- A new queued run: Rust builds it from its request and `made` (it is not read back).
if created and made[1] == 'queued' then return { 'ok', pub or false, 1, false, made } end
return { 'ok', pub or false, created and 1 or 0, run_fields(id) }
