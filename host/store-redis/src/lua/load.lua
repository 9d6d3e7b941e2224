-- The tenant's unended runs per function and status (the intersection of its `byfn:`
-- and `st:` indexes), and its oldest queued run's creation time. ARGV[5..]: the
-- statuses. Answers 'ok', the oldest ('' for none), then (function, status, count)
-- triples with a count.
local out = {}
local fns = rcall('SMEMBERS', P .. 'fns')
table.sort(fns)
for _, f in ipairs(fns) do
  for i = 5, #ARGV do
    local n = rcall('ZINTERCARD', 2, P .. 'byfn:' .. f, stkey(ARGV[i]))
    if n > 0 then
      out[#out + 1] = f
      out[#out + 1] = ARGV[i]
      out[#out + 1] = n
    end
  end
end
local oldest = rcall('ZRANGE', stkey('queued'), 0, 0, 'WITHSCORES')
return { 'ok', oldest[2] or '', out }
