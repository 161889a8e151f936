-- Acknowledge delivered ids and delete their messages.
-- KEYS: stream, alias, state, due, parked. ARGV: message ids. Returns the ids that were
-- not pending.
local stream, alias, state, due, parked = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local unknown, acked = {}, {}
-- Given back (a nack, a released stream) or waiting for a retry and not redelivered
-- yet: a late ack of its holder still settles it.
local function was_parked(sid)
  if redis.call('ZREM', parked, sid) == 0 then return false end
  redis.call('ZREM', due, 'r:' .. sid)
  return true
end
for i = 1, #ARGV do
  local sid = ARGV[i] .. '-0'
  if redis.call('XACK', stream, GROUP, sid) == 1 or was_parked(sid) then
    acked[#acked + 1] = sid
  else
    -- A delayed message is stored under a later position than its id.
    local moved = redis.call('HGET', alias, ARGV[i])
    if moved and (redis.call('XACK', stream, GROUP, moved) == 1 or was_parked(moved)) then
      redis.call('HDEL', alias, ARGV[i])
      acked[#acked + 1] = moved
    else
      unknown[#unknown + 1] = ARGV[i]
    end
  end
end
for i = 1, #acked, 1000 do
  redis.call('XDEL', stream, unpack(acked, i, math.min(i + 999, #acked)))
end
if #acked > 0 and redis.call('EXISTS', state) == 1 then
  for _, sid in ipairs(acked) do
    redis.call('HDEL', state, sid, 'f:' .. sid, 'e:' .. sid, 'l:' .. sid)
  end
end
return unknown
