-- Acknowledge delivered ids and delete their messages. KEYS: stream. ARGV: stream ids.
-- Returns the ids that were not pending.
local stream = KEYS[1]
local unknown, acked = {}, {}
for i = 1, #ARGV do
  if redis.call('XACK', stream, GROUP, ARGV[i]) == 1 then
    acked[#acked + 1] = ARGV[i]
  else
    unknown[#unknown + 1] = ARGV[i]
  end
end
for i = 1, #acked, 1000 do
  redis.call('XDEL', stream, unpack(acked, i, math.min(i + 999, #acked)))
end
return unknown
