-- Acknowledge every id up to ARGV[2] pending for consumer ARGV[1]. KEYS: QueueKeys.ack_keys.
-- Returns how many were acknowledged.
local a = ack_keys(KEYS, 1)
local consumer, upto = ARGV[1], ARGV[2]
local total = 0
while true do
  local pending = redis.call('XPENDING', a.stream, GROUP, '-', upto, 1000, consumer)
  if #pending == 0 then return total end
  local ids = {}
  for i, p in ipairs(pending) do ids[i] = p[1] end
  redis.call('XACK', a.stream, GROUP, unpack(ids))
  ack_forget(a, ids)
  total = total + #ids
  if #pending < 1000 then return total end
end
