-- Forward a delivery in one step: store messages in the target queue and ack the
-- delivery in its source queue, both on this server (see busmq.forwarding).
-- KEYS: the target's info, stream, due, delayed; the source's QueueKeys.ack_keys.
-- ARGV: [1] the delivery's id, then a push's arguments (see push_lib.lua).
-- Returns {first id, count}, or {-1, 0} when the delivery was not pending (settled
-- already, here or by another consumer): nothing is stored then.
local info, stream = KEYS[1], KEYS[2]
if redis.call('EXISTS', info) == 0 then return redis.error_reply('NOQUEUE queue does not exist') end
local n = push_count(1)
local conf, full = push_limits(info, stream, n, 1)
if not conf then return full end
local a = ack_keys(KEYS, 5)
local sid = ack_find(a.stream, a.alias, a.due, a.parked, ARGV[1])
if not sid then return {-1, 0} end
ack_forget(a, {sid})
if n == 0 then return {0, 0} end
return {push_write(info, stream, KEYS[3], KEYS[4], conf, n, 1), n}
