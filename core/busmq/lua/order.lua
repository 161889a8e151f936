-- Set or remove a queue's ordering per key (busmq/ordering.py). KEYS: QueueKeys.all().
-- ARGV: the header that holds a message's key ('' removes the ordering).
-- Removing it (or changing the header) makes every waiting entry due at once, in stream
-- order, and frees every key. Setting it takes, for each delivery pending now, its key
-- (the first pending of a key in stream order): a key's next message waits for it.
-- Refused on a replay queue. Wakes the consumers (a 'c' publication).
local q = queue_keys(KEYS, 1)
if redis.call('EXISTS', q.info) == 0 then return redis.error_reply('NOQUEUE queue does not exist') end
local header = ARGV[1]
local conf = redis.call('HMGET', q.info, 'order', 'mode')
if header ~= '' and conf[2] == 'replay' then
  return redis.error_reply('ORDERED a replay queue cannot be ordered per key: its readers settle nothing')
end
if conf[1] and conf[1] ~= header then
  local waiting = redis.call('ZRANGE', q.blocked, 0, -1)
  for _, member in ipairs(waiting) do
    local sid = member_sid(member)
    redis.call('ZADD', q.due, position(sid), 'o:' .. sid)
  end
  redis.call('DEL', q.blocked, q.held)
  redis.call('HDEL', q.info, 'order')
end
if header ~= '' and conf[1] ~= header then
  redis.call('HSET', q.info, 'order', header)
  local start = '-'
  local ok, groups = pcall(redis.call, 'XINFO', 'GROUPS', q.stream)
  while ok and #groups > 0 do
    local pending = redis.call('XPENDING', q.stream, GROUP, start, '+', 1000)
    for _, p in ipairs(pending) do
      local entry = redis.call('XRANGE', q.stream, p[1], p[1])[1]
      local raw = entry and field(entry[2], 'h')
      local key = raw and raw ~= '' and cjson.decode(raw)[header]
      if type(key) == 'string' and redis.call('HEXISTS', q.held, 'k:' .. key) == 0 then
        redis.call('HSET', q.held, HELD_PIN, HELD_PIN_VALUE, 'k:' .. key, p[1], 's:' .. p[1], key)
      end
    end
    if #pending < 1000 then break end
    start = '(' .. pending[#pending][1]
  end
end
announce_parked(q)
return 1
