local G, tenant, seq, ns, wake = ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4], tonumber(ARGV[5])
local update = false
if seq > 0 then
  local cur = rcall('HGET', G .. 'seq', tenant)
  if not cur or tonumber(cur) < seq then
    update = true
    rcall('HSET', G .. 'seq', tenant, seq)
  end
end
-- A tenant with named queues: 'mq', then (queue, next, wake) triples.
local qs = nil
if ARGV[6] == 'mq' then
  qs = {}
  for i = 7, #ARGV do qs[#qs + 1] = ARGV[i] end
end
apply_hint(G, tenant, ns, wake, update, qs)
return 1
