-- A page of runs, newest first, by creation time within [ARGV[9], ARGV[8]]: ARGV[7] runs
-- from the ARGV[6]th of index ARGV[5], or with ARGV[5] = '*' of every run, which the
-- `st:` indexes hold between them (merged here: each gives its newest ARGV[6] + ARGV[7]).
-- Answers how many ids the page held and the runs still there.
local start, page = tonumber(ARGV[6]), tonumber(ARGV[7])
local ids
if ARGV[5] == '*' then
  local all = {}
  for _, status in ipairs(STATUSES) do
    local got = rcall('ZREVRANGEBYSCORE', stkey(status), ARGV[8], ARGV[9], 'WITHSCORES',
      'LIMIT', 0, start + page)
    for i = 1, #got, 2 do all[#all + 1] = { tonumber(got[i + 1]), got[i] } end
  end
  -- As one index would order them: score, then member, both descending.
  table.sort(all, function(a, b)
    if a[1] ~= b[1] then return a[1] > b[1] end
    return a[2] > b[2]
  end)
  ids = {}
  for i = start + 1, math.min(#all, start + page) do ids[#ids + 1] = all[i][2] end
else
  ids = rcall('ZREVRANGEBYSCORE', P .. ARGV[5], ARGV[8], ARGV[9], 'LIMIT', start, page)
end
local out = {}
for _, id in ipairs(ids) do
  local h = run_fields(id)
  if h[1] then out[#out + 1] = h end
end
return { 'ok', #ids, out }
