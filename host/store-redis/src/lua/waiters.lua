local name = ARGV[5]
local page = rcall('SSCAN', P .. 'waiters:' .. name, ARGV[6], 'COUNT', ARGV[7])
local ws = {}
for _, w in ipairs(page[2]) do
  local r = rcall('HMGET', runkey(w), 'status', 'wait_event', 'wait_ver', 'wait')
  if r[1] == 'waiting' and r[2] == name then ws[#ws + 1] = { w, r[3], r[4] } end
end
return { 'ok', page[1], ws }
