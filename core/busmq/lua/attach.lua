-- Attach (create if ARGV[4] == '1') or renew a lease on a queue ('0': renew, taking the
-- member back if its lease lapsed; '2': renew only a lease still held).
-- KEYS: QueueKeys.with_dead_letters() (the queue's, then its dead-letter queue's)
-- ARGV: member, lease_ms, ttl_ms ('' keeps), create, maxlen, maxage_ms, backlog ('' keeps, '0' clears)
-- Returns {created (0/1), attachments}, {-1, 0} if the queue is gone and create is off, or
-- {-2, 0} if a strict renew found the lease released or lapsed.
local q, dq = queue_keys(KEYS, 1), queue_keys(KEYS, 1 + QUEUE_KEYS)
local info, stream, meta, leases = q.info, q.stream, q.meta, q.leases
local now = now_ms()
local created = 0
if redis.call('EXISTS', info) == 0 then
  if ARGV[4] ~= '1' then return {-1, 0} end
  -- Leftovers of an expired incarnation must not leak into the new one.
  redis.call('DEL', unpack(q.all))
  redis.call('HSET', info, 'seq', 0, 'created', now, 'ttl', ARGV[3])
  redis.call('XGROUP', 'CREATE', stream, GROUP, '0', 'MKSTREAM')
  created = 1
elseif ARGV[4] == '2' then
  local held = redis.call('ZSCORE', leases, ARGV[1])
  if not held or tonumber(held) < now then return {-2, 0} end
elseif ARGV[3] ~= '' then
  redis.call('HSET', info, 'ttl', ARGV[3])
end
local limits = {maxlen = ARGV[5], maxage = ARGV[6], backlog = ARGV[7]}
for name, value in pairs(limits) do
  if value == '0' then redis.call('HDEL', info, name)
  elseif value ~= '' then redis.call('HSET', info, name, value) end
end
redis.call('ZADD', leases, now + tonumber(ARGV[2]), ARGV[1])
local conf = redis.call('HMGET', info, 'maxage', 'mode')
if conf[1] then trim_age(stream, now - tonumber(conf[1])) end
-- At-most-once reads delete what they read right after reading: this collects what a
-- consumer that died in between left behind.
if conf[2] == 'destructive' then trim_settled(stream, q.parked) end
local ttl = tonumber(redis.call('HGET', info, 'ttl'))
local attachments = refresh_expiry(q.all, leases, now, ttl)
outlive(dq, q)
return {created, attachments}
