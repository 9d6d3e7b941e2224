local LIMIT = tonumber(ARGV[7])
local n = 0
-- What the walk below reads of a candidate: what deciding needs (status, finished_at)
-- and what `delete` does, in one HMGET.
local FIELDS = { 'status', 'function', 'parent', 'idempotency_key', 'sbytes', 'lbytes',
  'digest', 'sv', 'finished_at' }
-- Deletes run `id`, whose FIELDS are `r`.
local function delete(id, r)
  local rk = runkey(id)
  charge(nil, -(tonumber(r[5] or '0') + tonumber(r[6] or '0')))
  if r[7] or r[8] then
    local k = pin(r[7], r[8])
    if rcall('HINCRBY', KRDIG, k, '-1') <= 0 then rcall('HDEL', KRDIG, k) end
  end
  if r[1] then rcall('ZREM', stkey(r[1]), id) end
  if r[2] then rcall('ZREM', byfnkey(r[2]), id) end
  if r[3] then rcall('ZREM', P .. 'kids:' .. r[3], id) end
  if r[2] and r[4] then
    local ik = P .. 'idem:' .. r[2]
    local v = rcall('HGET', ik, r[4])
    if v and string.sub(v, -#id) == id then rcall('HDEL', ik, r[4]) end
  end
  rcall('DEL', rk, P .. 'steps:' .. id, P .. 'stepseq:' .. id, P .. 'att:' .. id,
    P .. 'logs:' .. id, P .. 'rw:' .. id, inkey(id))
  -- Its webhook deliveries.
  local dk = P .. 'dlvrun:' .. id
  for _, d in ipairs(rcall('LRANGE', dk, 0, -1)) do
    rcall('DEL', P .. 'dlv:' .. d)
    rcall('ZREM', P .. 'dlvq', d)
  end
  rcall('DEL', dk)
end
-- Indexes an older wasq kept: of all runs, `all`; of running runs, `st:running` (they are
-- indexed by their lease alone now); of ended runs by finish time, `ended:ok` and
-- `ended:bad` (the status indexes below find them). A tenant's first purge since drops
-- them (UNLINK frees them off Redis's main thread).
local dropped = rcall('HMGET', KMETA, 'noall', 'norun', 'noended')
for i, old in ipairs({ { 'noall', P .. 'all' }, { 'norun', stkey('running') },
  { 'noended', P .. 'ended:ok', P .. 'ended:bad' } }) do
  if dropped[i] ~= '1' then
    rcall('UNLINK', unpack(old, 2))
    rcall('HSET', KMETA, old[1], '1')
  end
end
-- Ended runs are found through their status index, by creation time: a run created
-- before its status's cutoff is deleted when it also finished before it, and kept when it
-- ended since (it ran or waited long). So that kept runs cannot hold the purge up, each
-- index is walked from a cursor (the meta's `pc:<status>`: the score the next walk starts
-- after), which moves past each run kept, and starts over once the walk reaches the
-- cutoff; a call reads at most SCAN runs for LIMIT deletions.
local SCAN = 4 * LIMIT
for _, e in ipairs({ { 'succeeded', ARGV[5] }, { 'skipped', ARGV[5] }, { 'failed', ARGV[6] },
  { 'cancelled', ARGV[6] } }) do
  local status, cutoff = e[1], e[2]
  local key, cf, before = stkey(status), 'pc:' .. status, tonumber(cutoff)
  local from = rcall('HGET', KMETA, cf)
  local cursor, wrapped = from, from == nil
  while n < LIMIT and SCAN > 0 do
    local got = rcall('ZRANGEBYSCORE', key, cursor or '-inf', '(' .. cutoff, 'WITHSCORES',
      'LIMIT', 0, math.min(SCAN, LIMIT - n))
    if #got == 0 then
      -- The walk reached the cutoff: it starts over (within this call, once, when it
      -- did not start at the beginning).
      cursor = nil
      if wrapped then break end
      wrapped = true
    end
    for i = 1, #got, 2 do
      local id = got[i]
      SCAN = SCAN - 1
      local r = rcall('HMGET', runkey(id), unpack(FIELDS))
      if r[1] ~= status then
        -- Not a run in this status (any more): an entry no run backs is dropped.
        rcall('ZREM', key, id)
      elseif tonumber(r[9] or got[i + 1]) < before then
        delete(id, r)
        n = n + 1
      else
        cursor = '(' .. got[i + 1]
      end
    end
  end
  if cursor ~= from then
    if cursor then rcall('HSET', KMETA, cf, cursor) else rcall('HDEL', KMETA, cf) end
  end
end
-- Event ids are only remembered for their dedup window.
forget_events(LIMIT)
return { 'ok', n }
