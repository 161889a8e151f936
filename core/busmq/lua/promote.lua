-- Store the delayed messages that are due in the stream (for replay readers, which do
-- not run read.lua). KEYS: QueueKeys.all(). ARGV: at most this many.
-- Returns ms until the next one is due, or -1.
local q = queue_keys(KEYS, 1)
if redis.call('EXISTS', q.due) == 0 then return -1 end
local now = now_ms()
for _, member in ipairs(redis.call('ZRANGEBYSCORE', q.due, '-inf', now, 'LIMIT', 0, tonumber(ARGV[1]))) do
  redis.call('ZREM', q.due, member)
  if string.sub(member, 1, 1) == 'p' then promote_delayed(q, string.sub(member, 3)) end
end
local head = redis.call('ZRANGE', q.due, 0, 0, 'WITHSCORES')
if head[2] then return math.max(1, tonumber(head[2]) - now) end
return -1
