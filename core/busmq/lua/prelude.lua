-- Shared helpers, prepended to every busmq script.
-- Queue keys (all with the same {name} hash tag):
--   stream: messages, entry id "<id>-0", fields p (payload), k (kind), t (ms), h (headers)
--   info:   hash seq (last id), created, ttl (ms), mode, maxlen, maxage (ms), backlog
--   meta:   user metadata hash
--   leases: zset attachment -> lease expiry (ms)
local GROUP = 'busmq'

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local function field(entry_fields, name)
  for j = 1, #entry_fields, 2 do
    if entry_fields[j] == name then return entry_fields[j + 1] end
  end
  return nil
end

-- Drop entries pushed before cutoff (ms); bounded work per call.
local function trim_age(stream, cutoff)
  local head = redis.call('XRANGE', stream, '-', '+', 'COUNT', 1)
  if #head == 0 or tonumber(field(head[1][2], 't') or cutoff) >= cutoff then return end
  local batch = redis.call('XRANGE', stream, '-', '+', 'COUNT', 1000)
  for _, entry in ipairs(batch) do
    if tonumber(field(entry[2], 't') or cutoff) >= cutoff then
      redis.call('XTRIM', stream, 'MINID', entry[1])
      return
    end
  end
  local last = batch[#batch][1]
  redis.call('XTRIM', stream, 'MINID', string.format('%d-0', tonumber(string.match(last, '^(%d+)')) + 1))
end

-- In a destructive queue, remove messages the consumer group has moved past and that
-- are not pending: at-most-once reads delete what they read right after reading, and
-- this collects what a consumer that died in between left behind.
local function collect_consumed(stream)
  local ok, groups = pcall(redis.call, 'XINFO', 'GROUPS', stream)
  if not ok then return end
  for _, g in ipairs(groups) do
    if g[2] == GROUP then
      local floor = tonumber(string.match(g[8], '^(%d+)')) + 1
      local summary = redis.call('XPENDING', stream, GROUP)
      if summary[1] > 0 then
        floor = math.min(floor, tonumber(string.match(summary[2], '^(%d+)')))
      end
      redis.call('XTRIM', stream, 'MINID', string.format('%d-0', floor))
    end
  end
end

-- Expire every key of the queue when the last lease lapses plus the idle ttl.
local function refresh_expiry(keys, leases, now, ttl)
  redis.call('ZREMRANGEBYSCORE', leases, '-inf', now)
  local last = redis.call('ZRANGE', leases, -1, -1, 'WITHSCORES')
  local pttl = ttl
  if #last > 0 then pttl = math.max(tonumber(last[2]) - now, 0) + ttl end
  for _, key in ipairs(keys) do redis.call('PEXPIRE', key, pttl) end
  return redis.call('ZCARD', leases)
end
