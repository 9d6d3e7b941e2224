local out = {}
for _, name in ipairs(rcall('SMEMBERS', P .. 'fns')) do
  local h = rcall('HGETALL', P .. 'fn:' .. name)
  if #h > 0 then out[#out + 1] = h end
end
return { 'ok', out }
