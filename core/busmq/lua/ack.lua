-- Acknowledge delivered ids and delete their messages.
-- KEYS: QueueKeys.ack_keys. ARGV: message ids. Returns the ids that were not pending.
local a = ack_keys(KEYS, 1)
local unknown, acked = {}, {}
for i = 1, #ARGV do
  local sid = ack_find(a.stream, a.alias, a.due, a.parked, ARGV[i])
  if sid then acked[#acked + 1] = sid else unknown[#unknown + 1] = ARGV[i] end
end
ack_forget(a, acked)
return unknown
