local out = {}
local ids = redis.call('ZREVRANGEBYSCORE', P .. ARGV[5], ARGV[8], ARGV[9], 'LIMIT', ARGV[6], ARGV[7])
for _, id in ipairs(ids) do
  local h = run_fields(id)
  if h[1] then out[#out + 1] = h end
end
return { 'ok', #ids, out }
