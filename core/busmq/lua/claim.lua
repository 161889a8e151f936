-- Take over deliveries idle longer than the visibility timeout, oldest first; those
-- already delivered max_deliveries times go to the dead-letter queue instead.
-- KEYS: QueueKeys.with_dead_letters(). ARGV: consumer, min_idle_ms, count,
-- forget_idle_ms, max_deliveries ('' for the queue's), queue name.
-- Returns a flat list: id, delivery count, fields, ... Also forgets consumers that have
-- had nothing pending for forget_idle_ms (they are dead or long gone).
local q, dq = queue_keys(KEYS, 1), queue_keys(KEYS, 1 + QUEUE_KEYS)
local stream, consumer, min_idle = q.stream, ARGV[1], ARGV[2]
local max_deliveries = tonumber(ARGV[5] ~= '' and ARGV[5] or redis.call('HGET', q.info, 'maxdel') or '')
local now
local out = {}
local promoted = false
local pending = redis.call('XPENDING', stream, GROUP, 'IDLE', min_idle, '-', '+', ARGV[3])
for _, p in ipairs(pending) do
  local sid, idle, count = p[1], p[3], p[4]
  if max_deliveries and count >= max_deliveries then
    local entry = redis.call('XRANGE', stream, sid, sid)[1]
    now = now or now_ms()
    if entry then
      promoted = dead_letter(q, dq, ARGV[6], sid, entry[2], 'max-deliveries', count, now, nil, now - idle) or promoted
    else
      redis.call('XACK', stream, GROUP, sid)
      promoted = order_settled(q, sid) or promoted
    end
  else
    if count == 1 and max_deliveries then
      now = now or now_ms()
      redis.call('HSETNX', q.state, 'f:' .. sid, now - idle) -- the first delivery's time
    end
    local claimed = redis.call('XCLAIM', stream, GROUP, consumer, min_idle, sid)
    local entry = claimed[1]
    if entry and entry[2] then
      out[#out + 1] = entry[1]
      out[#out + 1] = count + 1
      out[#out + 1] = entry[2]
    elseif entry ~= nil then
      -- Redis 6.2 returns nil for a pending id whose message was trimmed: settle it.
      redis.call('XACK', stream, GROUP, sid)
      promoted = order_settled(q, sid) or promoted
    end
  end
end
local consumers = redis.call('XINFO', 'CONSUMERS', stream, GROUP)
for _, c in ipairs(consumers) do
  local name, pending_count, idle = c[2], c[4], c[6]
  if name ~= consumer and pending_count == 0 and idle > tonumber(ARGV[4]) then
    redis.call('XGROUP', 'DELCONSUMER', stream, GROUP, name)
  end
end
if promoted then announce_parked(q) end
return out
