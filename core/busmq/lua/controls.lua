-- Set control fields of a queue's info hash (an empty value removes the field) and wake
-- its consumers, so they read again under the new settings (a 'c' publication: each
-- consumer's next read is the full one that applies controls; a 'p' after it when the
-- queue was paused).
-- KEYS: info. ARGV: notify channel, then field, value pairs.
if redis.call('EXISTS', KEYS[1]) == 0 then return redis.error_reply('NOQUEUE queue does not exist') end
for i = 2, #ARGV, 2 do
  if ARGV[i + 1] == '' then
    redis.call('HDEL', KEYS[1], ARGV[i])
  else
    redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1])
  end
end
redis.call('PUBLISH', ARGV[1], 'c')
for i = 2, #ARGV, 2 do
  -- Paused: consumers also give back what they fetched and have not handed out.
  if ARGV[i] == 'paused' and ARGV[i + 1] ~= '' then redis.call('PUBLISH', ARGV[1], 'p') end
end
return 1
