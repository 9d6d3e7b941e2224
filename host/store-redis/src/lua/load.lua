-- The tenant's unended runs per function and status (a function's `qfn:` index, and the
-- intersection of its `byfn:` index with `st:<status>` — `leases` for running runs, and
-- for queued runs from before `qfn:`, `st:queued`), and its oldest queued run's creation
-- time. ARGV[5..]: the statuses. Answers 'ok', the oldest ('' for none), then
-- (function, status, count) triples with a count.
local out = {}
local fns = rcall('SMEMBERS', P .. 'fns')
table.sort(fns)
local legacy = rcall('EXISTS', stkey('queued')) == 1
local oldest = rcall('ZRANGE', stkey('queued'), 0, 0, 'WITHSCORES')[2]
for _, f in ipairs(fns) do
  for i = 5, #ARGV do
    local n = 0
    if ARGV[i] == 'queued' then
      n = rcall('ZCARD', qfnkey(f))
      if n > 0 then
        local first = rcall('ZRANGE', qfnkey(f), 0, 0, 'WITHSCORES')[2]
        if not oldest or tonumber(first) < tonumber(oldest) then oldest = first end
      end
    end
    if ARGV[i] ~= 'queued' or legacy then
      local k = ARGV[i] == 'running' and KLEASES or stkey(ARGV[i])
      n = n + rcall('ZINTERCARD', 2, byfnkey(f), k)
    end
    if n > 0 then
      out[#out + 1] = f
      out[#out + 1] = ARGV[i]
      out[#out + 1] = n
    end
  end
end
return { 'ok', oldest or '', out }
