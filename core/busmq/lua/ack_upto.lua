-- Acknowledge every id up to ARGV[2] pending for consumer ARGV[1]. KEYS: stream.
-- Returns how many were acknowledged.
local stream, consumer, upto = KEYS[1], ARGV[1], ARGV[2]
local total = 0
while true do
  local pending = redis.call('XPENDING', stream, GROUP, '-', upto, 1000, consumer)
  if #pending == 0 then return total end
  local ids = {}
  for i, p in ipairs(pending) do ids[i] = p[1] end
  redis.call('XACK', stream, GROUP, unpack(ids))
  redis.call('XDEL', stream, unpack(ids))
  total = total + #ids
  if #pending < 1000 then return total end
end
