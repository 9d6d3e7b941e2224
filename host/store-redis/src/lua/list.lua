-- A page of runs, newest first, by creation time within [ARGV[8], ARGV[7]]: ARGV[6] runs
-- from the ARGV[5]th of the indexes ARGV[9..] (names after the tenant's prefix) merged,
-- where `*` stands for every run's indexes and `*queued` for every queued run's
-- (run_indexes). Each index gives its newest ARGV[5] + ARGV[6]. Answers how many ids the
-- page held and the runs still there.
local start, page = tonumber(ARGV[5]), tonumber(ARGV[6])
local keys = {}
for i = 9, #ARGV do
  if ARGV[i] == '*' or ARGV[i] == '*queued' then
    for _, k in ipairs(run_indexes(ARGV[i] == '*queued')) do keys[#keys + 1] = k end
  else
    keys[#keys + 1] = P .. ARGV[i]
  end
end
-- Running runs are indexed by their lease alone (`leases`, scored by expiry): their
-- creation time is their id's first 48 bits (wasq_core::ids), and an entry whose run left
-- the status (dropped by the claim that meets it) is not listed.
local has_leases = false
for _, k in ipairs(keys) do
  if k == KLEASES then has_leases = true end
end
local function bound(v, inf)
  if v == '+inf' or v == '-inf' then return inf end
  return tonumber(v)
end
local ids
if #keys == 1 and not has_leases then
  ids = rcall('ZREVRANGEBYSCORE', keys[1], ARGV[7], ARGV[8], 'LIMIT', start, page)
else
  local all = {}
  local hi, lo = bound(ARGV[7], math.huge), bound(ARGV[8], -math.huge)
  for _, k in ipairs(keys) do
    if k == KLEASES then
      for _, id in ipairs(rcall('ZRANGEBYSCORE', k, '-inf', '(+inf')) do
        local t = tonumber(string.sub(id, 1, 8) .. string.sub(id, 10, 13), 16)
        if t and t >= lo and t <= hi and rcall('HGET', runkey(id), 'status') == 'running' then
          all[#all + 1] = { t, id }
        end
      end
    else
      local got = rcall('ZREVRANGEBYSCORE', k, ARGV[7], ARGV[8], 'WITHSCORES',
        'LIMIT', 0, start + page)
      for i = 1, #got, 2 do all[#all + 1] = { tonumber(got[i + 1]), got[i] } end
    end
  end
  -- As one index would order them: score, then member, both descending.
  table.sort(all, function(a, b)
    if a[1] ~= b[1] then return a[1] > b[1] end
    return a[2] > b[2]
  end)
  ids = {}
  for i = start + 1, math.min(#all, start + page) do ids[#ids + 1] = all[i][2] end
end
local out = {}
for _, id in ipairs(ids) do
  local h = run_fields(id)
  if h[1] then out[#out + 1] = h end
end
return { 'ok', #ids, out }
