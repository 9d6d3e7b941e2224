local G, tenant, seq, ns, wake = ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4], tonumber(ARGV[5])
local update = false
if seq > 0 then
  local cur = redis.call('HGET', G .. 'seq', tenant)
  if not cur or tonumber(cur) < seq then
    update = true
    redis.call('HSET', G .. 'seq', tenant, seq)
  end
end
local qs = {}
for i = 6, #ARGV do qs[#qs + 1] = ARGV[i] end
apply_hint(G, tenant, ns, wake, update, qs)
return 1
