-- Set or remove a queue's schema (busmq/queue_schema.py). KEYS: info.
-- The versions live in the info hash: 'sch:<n>' holds version n (JSON: kind, document,
-- created ms), 'schemas' how many were set, 'schema' the current one's token
-- '<n>:<created ms>' (absent: none is enforced; see busmq/schemas.py ValidatorCache),
-- 'schemac' the compatibility mode (absent: BACKWARD).
-- ARGV: op ('set', 'remove', 'mode'), then for 'set': the version count the caller
-- checked compatibility against, the new version's JSON, the mode to keep ('' leave it),
-- the new version's created ms;
-- for 'mode': the mode. 'set' refuses with CONFLICT when another version was set since
-- (the caller checks again); it returns the new version's number.
local info = KEYS[1]
if redis.call('EXISTS', info) == 0 then return redis.error_reply('NOQUEUE queue does not exist') end
local op = ARGV[1]
if op == 'remove' then
  redis.call('HDEL', info, 'schema')
  return 0
end
if op == 'mode' then
  redis.call('HSET', info, 'schemac', ARGV[2])
  return 0
end
local count = tonumber(redis.call('HGET', info, 'schemas') or '0')
if count ~= tonumber(ARGV[2]) then return redis.error_reply('CONFLICT ' .. count) end
local version = count + 1
redis.call('HSET', info, 'sch:' .. version, ARGV[3], 'schemas', version, 'schema', version .. ':' .. ARGV[5])
if ARGV[4] ~= '' then redis.call('HSET', info, 'schemac', ARGV[4]) end
return version
