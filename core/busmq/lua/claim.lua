-- Take over deliveries idle longer than the visibility timeout, oldest first.
-- KEYS: stream. ARGV: consumer, min_idle_ms, count, forget_idle_ms.
-- Returns a flat list: id, delivery count, fields, ... Also forgets consumers that have
-- had nothing pending for forget_idle_ms (they are dead or long gone).
local stream, consumer, min_idle = KEYS[1], ARGV[1], ARGV[2]
local out = {}
local pending = redis.call('XPENDING', stream, GROUP, 'IDLE', min_idle, '-', '+', ARGV[3])
for _, p in ipairs(pending) do
  local claimed = redis.call('XCLAIM', stream, GROUP, consumer, min_idle, p[1])
  local entry = claimed[1]
  if entry and entry[2] then
    out[#out + 1] = entry[1]
    out[#out + 1] = p[4] + 1
    out[#out + 1] = entry[2]
  elseif entry ~= nil then
    -- Redis 6.2 returns nil for a pending id whose message was trimmed: settle it.
    redis.call('XACK', stream, GROUP, p[1])
  end
end
local consumers = redis.call('XINFO', 'CONSUMERS', stream, GROUP)
for _, c in ipairs(consumers) do
  local name, pending_count, idle = c[2], c[4], c[6]
  if name ~= consumer and pending_count == 0 and idle > tonumber(ARGV[4]) then
    redis.call('XGROUP', 'DELCONSUMER', stream, GROUP, name)
  end
end
return out
