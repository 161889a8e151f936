-- Acknowledge delivered ids and delete their messages.
-- KEYS: QueueKeys.ack_keys. ARGV: message ids. Returns the ids that were not pending.
local a = ack_keys(KEYS, 1)
local acked, unknown = ack_all(a, ARGV)
ack_forget(a, acked)
return unknown
