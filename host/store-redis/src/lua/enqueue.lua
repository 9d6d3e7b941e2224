local id, created, err, woke = insert_run(ARGV[5], ARGV[6], ARGV[7], ARGV[8], ARGV[9], ARGV[10],
  ARGV[11], ARGV[12], ARGV[13], ARGV[14], read_flow(15))
if type(err) == 'table' then return err end
if err then return { err } end
local wake = woke
local r = redis.call('HMGET', runkey(id), 'due_at', 'status')
if created and r[2] == 'queued' and tonumber(r[1]) <= NOW then wake = wake + 1 end
local pub = publish(wake, false)
return { 'ok', pub or false, created and 1 or 0, run_fields(id) }
