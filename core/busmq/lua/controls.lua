-- Set control fields of a queue's info hash (an empty value removes the field) and wake
-- its consumers, so they read again under the new settings.
-- KEYS: info. ARGV: notify channel, then field, value pairs.
if redis.call('EXISTS', KEYS[1]) == 0 then return redis.error_reply('NOQUEUE queue does not exist') end
for i = 2, #ARGV, 2 do
  if ARGV[i + 1] == '' then
    redis.call('HDEL', KEYS[1], ARGV[i])
  else
    redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1])
  end
end
redis.call('PUBLISH', ARGV[1], 0)
return 1
