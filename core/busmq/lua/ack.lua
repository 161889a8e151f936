-- Acknowledge delivered ids and delete their messages.
-- KEYS: stream, alias, state, due, parked. ARGV: message ids. Returns the ids that were
-- not pending.
local stream, alias, state, due, parked = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local unknown, acked = {}, {}
for i = 1, #ARGV do
  local sid = ack_find(stream, alias, due, parked, ARGV[i])
  if sid then acked[#acked + 1] = sid else unknown[#unknown + 1] = ARGV[i] end
end
ack_forget(stream, state, acked)
return unknown
