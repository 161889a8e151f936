-- A queue's ordering per key at a glance. KEYS: QueueKeys.all().
-- Returns {keys held (a delivery of the key in flight or due), messages waiting for
-- their key, age in ms of the oldest waiting message or -1}.
local q = queue_keys(KEYS, 1)
local waiting = redis.call('ZCARD', q.blocked)
-- Two fields per key held, one per waiting entry, and maybe the '~' pin (prelude.lua).
local held = math.floor((redis.call('HLEN', q.held) - waiting) / 2)
local age = -1
if waiting > 0 then
  -- Waiting entries are parked, and not due (a retry or a key's turn is in `due`).
  for _, sid in ipairs(redis.call('ZRANGE', q.parked, 0, 99)) do
    if not redis.call('ZSCORE', q.due, 'r:' .. sid) and not redis.call('ZSCORE', q.due, 'o:' .. sid) then
      local entry = redis.call('XRANGE', q.stream, sid, sid)[1]
      local pushed = entry and tonumber(field(entry[2], 't'))
      if pushed then age = math.max(0, now_ms() - pushed) end
      break
    end
  end
end
return {held, waiting, age}
