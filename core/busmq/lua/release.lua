-- Give back every delivery pending for consumer ARGV[1] for redelivery at once, in
-- order, to the next read of any consumer (see give_back). KEYS: QueueKeys.all().
-- ARGV[2] '1': unless the queue is ordered per key (then nothing is given back: the
-- deliveries' reader may still be handling them, and a redelivery beside a handling
-- would run two messages of a key at once; their visibility timeout brings them back).
-- Returns how many were released.
local q = queue_keys(KEYS, 1)
local consumer = ARGV[1]
if ARGV[2] == '1' and redis.call('HEXISTS', q.info, 'order') == 1 then return 0 end
local held, start = {}, '-'
while true do
  local pending = redis.call('XPENDING', q.stream, GROUP, start, '+', 1000, consumer)
  for _, p in ipairs(pending) do held[#held + 1] = p end
  if #pending < 1000 then break end
  start = '(' .. pending[#pending][1]
end
local now = now_ms()
for _, p in ipairs(held) do give_back(q, p[1], p[4], now - p[3]) end
if #held > 0 then announce_parked(q) end
return #held
