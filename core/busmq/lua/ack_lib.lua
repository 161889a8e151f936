-- Settling a delivery by ack: shared by ack.lua and the forward scripts.

-- Given back (a nack, a released stream) or waiting for a retry and not redelivered
-- yet: a late ack of its holder still settles it.
local function was_parked(due, parked, sid)
  if redis.call('ZREM', parked, sid) == 0 then return false end
  redis.call('ZREM', due, 'r:' .. sid)
  return true
end

-- Ack message id; the stream id it was pending (or parked) under, or nil if it was not.
local function ack_find(stream, alias, due, parked, id)
  local sid = id .. '-0'
  if redis.call('XACK', stream, GROUP, sid) == 1 or was_parked(due, parked, sid) then
    return sid
  end
  -- A delayed message is stored under a later position than its id.
  local moved = redis.call('HGET', alias, id)
  if moved and (redis.call('XACK', stream, GROUP, moved) == 1 or was_parked(due, parked, moved)) then
    redis.call('HDEL', alias, id)
    return moved
  end
  return nil
end

-- Delete acked entries and what was kept about them (retries, forwarding).
local function ack_forget(stream, state, acked)
  for i = 1, #acked, 1000 do
    redis.call('XDEL', stream, unpack(acked, i, math.min(i + 999, #acked)))
  end
  if #acked > 0 and redis.call('EXISTS', state) == 1 then
    for _, sid in ipairs(acked) do
      redis.call('HDEL', state, sid, 'f:' .. sid, 'e:' .. sid, 'l:' .. sid, 'w:' .. sid)
    end
  end
end

-- The stream id under which message id is pending or parked (unsettled), or nil.
local function unsettled_sid(stream, alias, parked, id)
  local sid = redis.call('HGET', alias, id) or (id .. '-0')
  if #redis.call('XPENDING', stream, GROUP, sid, sid, 1) > 0 then return sid end
  if redis.call('ZSCORE', parked, sid) then return sid end
  return nil
end
