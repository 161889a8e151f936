-- Give back every delivery pending for consumer ARGV[1] so the next claim of any
-- consumer redelivers it: its idle time is set far in the past (JUSTID keeps the
-- delivery count). KEYS: stream. Returns how many were released.
local stream, consumer = KEYS[1], ARGV[1]
local total, start = 0, '-'
while true do
  local pending = redis.call('XPENDING', stream, GROUP, start, '+', 1000, consumer)
  if #pending == 0 then return total end
  local args = {'XCLAIM', stream, GROUP, consumer, 0}
  for _, p in ipairs(pending) do args[#args + 1] = p[1] end
  args[#args + 1] = 'IDLE'
  args[#args + 1] = 1000000000000
  args[#args + 1] = 'JUSTID'
  redis.call(unpack(args))
  total = total + #pending
  if #pending < 1000 then return total end
  start = '(' .. pending[#pending][1]
end
