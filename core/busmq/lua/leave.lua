-- A consumer that closed leaves the group when nothing is pending for it (what it still
-- holds stays with it until acked, given back or claimed; claim.lua forgets it later).
-- Without this, every consumer that ever read stays listed in the group.
-- KEYS: stream. ARGV: consumer. Returns 1 if it left, 0 if it holds deliveries.
local held = redis.pcall('XPENDING', KEYS[1], GROUP, '-', '+', 1, ARGV[1])
if type(held) ~= 'table' then return 0 end -- no group (the stream expired): nothing to do
if #held > 0 then return 0 end
redis.call('XGROUP', 'DELCONSUMER', KEYS[1], GROUP, ARGV[1])
return 1
