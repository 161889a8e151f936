-- Make a queue ready for a consumer. KEYS: info, stream. ARGV: mode family
-- ('destructive' or 'replay'), '1' if the consumer settles its deliveries (at-least-once).
-- Fixes the queue's mode if unset and (re)creates the consumer group if it is missing.
-- Returns {mode in force, last id}. A queue ordered per key refuses a consumer that
-- does not settle: its key would never be freed.
local info, stream = KEYS[1], KEYS[2]
if redis.call('EXISTS', info) == 0 then return redis.error_reply('NOQUEUE queue does not exist') end
local order = redis.call('HGET', info, 'order')
if order and ARGV[2] == '0' then
  return redis.error_reply('ORDERED the queue is ordered by header ' .. order ..
    ': its consumers must be at-least-once')
end
local current = redis.call('HGET', info, 'mode')
if not current then
  redis.call('HSET', info, 'mode', ARGV[1])
  current = ARGV[1]
end
if not pcall(redis.call, 'XINFO', 'GROUPS', stream) or #redis.call('XINFO', 'GROUPS', stream) == 0 then
  redis.call('XGROUP', 'CREATE', stream, GROUP, '0', 'MKSTREAM')
  local pttl = redis.call('PTTL', info)
  if pttl > 0 then redis.call('PEXPIRE', stream, pttl) end
end
return {current, tonumber(redis.call('HGET', info, 'seq'))}
