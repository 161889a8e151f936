-- Release an attachment. KEYS: QueueKeys.all(). ARGV: member.
-- Returns the attachments left, or -1 if the queue is gone.
local info, leases = KEYS[1], KEYS[4]
if redis.call('EXISTS', info) == 0 then return -1 end
redis.call('ZREM', leases, ARGV[1])
local ttl = tonumber(redis.call('HGET', info, 'ttl'))
return refresh_expiry(KEYS, leases, now_ms(), ttl)
