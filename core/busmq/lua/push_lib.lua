-- Storing messages: the checks and the writes of push.lua, shared with forward.lua.
-- A push's arguments start after ARGV[o]: dedupe_ms, notify channel, due (Unix ms, '+ms'
-- from now by Redis's clock, '' now), expires (the same; '' never), the stride (1 or 3),
-- the producer ('' or "<epoch> <sequence> <name>"), the token of the schema version the
-- messages were checked against ('' none: see busmq/schemas.py), then per message its payload alone
-- (plain bytes, no headers) or (payload, kind, headers). An entry has no 'k' field when
-- its kind is plain bytes; it has 'sv' (the schema version) when there is one.
-- A message due later keeps its id and waits in `delayed` until a read promotes it; in a
-- queue ordered per key it is stored in place instead, with field 'l' (due ms), so that
-- it holds its key's place (read.lua parks it until due).
-- Publishes the last id on the channel to wake idle consumers; 'c' instead for a message
-- due later or expiring, which consumers read in full (see read.lua) from then on.

local function push_count(o)
  return (#ARGV - o - 7) / tonumber(ARGV[o + 5])
end

local MAX_ORDER_KEY = 1024 -- bytes of an ordering key (busmq.ordering.MAX_KEY_BYTES)

-- The queue's limits (maxlen, maxage, backlog) and ordering header, or nil and the error
-- reply if n more messages would not fit, or one has an ordering key too long, or they
-- were checked against a schema version that is not the queue's (SCHEMA <current>: the
-- pusher loads that version, checks again and retries).
local function push_limits(info, stream, n, o)
  local conf = redis.call('HMGET', info, 'maxlen', 'maxage', 'backlog', 'order', 'schema')
  if (conf[5] or '') ~= ARGV[o + 7] then
    return nil, redis.error_reply('SCHEMA ' .. (conf[5] or ''))
  end
  if conf[3] and redis.call('XLEN', stream) + n > tonumber(conf[3]) then
    return nil, redis.error_reply('FULL ' .. conf[3])
  end
  if conf[4] and tonumber(ARGV[o + 5]) == 3 then
    for i = 0, n - 1 do
      local headers = ARGV[o + 8 + i * 3 + 2]
      -- JSON never encodes a string in fewer bytes than it holds: only headers longer
      -- than a key may be can hold one too long (decoding each cost a flood 1 us).
      local key = #headers > MAX_ORDER_KEY and cjson.decode(headers)[conf[4]]
      if type(key) == 'string' and #key > MAX_ORDER_KEY then
        return nil, redis.error_reply('ORDERED header ' .. conf[4] .. ' of message ' .. (i + 1) ..
          ' of the push is ' .. #key .. ' bytes, more than an ordering key may be (' .. MAX_ORDER_KEY .. ')')
      end
    end
  end
  return conf
end

-- Store the n messages of the push whose arguments start after ARGV[o]; the first id.
local function push_write(info, stream, due_key, delayed, conf, n, o)
  local stride = tonumber(ARGV[o + 5])
  local first = redis.call('HINCRBY', info, 'seq', n) - n + 1
  local now = now_ms()
  local stamp = string.format('%d', now)
  local function absolute(spec)
    if string.sub(spec, 1, 1) == '+' then return string.format('%d', now + tonumber(string.sub(spec, 2))) end
    return spec
  end
  local due, expires = absolute(ARGV[o + 3]), absolute(ARGV[o + 4])
  local delayed_push = due ~= '' and tonumber(due) > now
  local later = ''
  if delayed_push and conf[4] then
    delayed_push, later = false, due
    redis.call('HSET', info, 'later', 1)
  end
  local start = o + 8
  local version = string.match(ARGV[o + 7], '^(%d+)') or '' -- of the token '<n>:<ms>'
  local function message(i)
    local base = start + i * stride
    if stride == 1 then return ARGV[base], 'b', '' end
    return ARGV[base], ARGV[base + 1], ARGV[base + 2]
  end
  if delayed_push then
    for i = 0, n - 1 do
      local id = tostring(first + i)
      local payload, kind, headers = message(i)
      redis.call('HSET', delayed, id, cmsgpack.pack({payload, kind, stamp, headers, expires, version}))
      redis.call('ZADD', due_key, due, 'p:' .. id)
    end
    local pttl = redis.call('PTTL', info)
    if pttl > 0 then redis.call('PEXPIRE', delayed, pttl); redis.call('PEXPIRE', due_key, pttl) end
  elseif stride == 1 and expires == '' and later == '' and version == '' then
    for i = 0, n - 1 do
      redis.call('XADD', stream, string.format('%d-0', first + i), 'p', ARGV[start + i], 't', stamp)
    end
  else
    for i = 0, n - 1 do
      local id = string.format('%d-0', first + i)
      local payload, kind, headers = message(i)
      if headers == '' and expires == '' and later == '' and version == '' then
        if kind == 'b' then
          redis.call('XADD', stream, id, 'p', payload, 't', stamp)
        else
          redis.call('XADD', stream, id, 'p', payload, 'k', kind, 't', stamp)
        end
      else
        local args = {'XADD', stream, id, 'p', payload}
        if kind ~= 'b' then args[#args + 1] = 'k'; args[#args + 1] = kind end
        args[#args + 1] = 't'; args[#args + 1] = stamp
        if headers ~= '' then args[#args + 1] = 'h'; args[#args + 1] = headers end
        if expires ~= '' then args[#args + 1] = 'e'; args[#args + 1] = expires end
        if later ~= '' then args[#args + 1] = 'l'; args[#args + 1] = later end
        if version ~= '' then args[#args + 1] = 'sv'; args[#args + 1] = version end
        redis.call(unpack(args))
      end
    end
  end
  if expires ~= '' then redis.call('HSET', info, 'expiring', 1) end
  if conf[1] then redis.call('XTRIM', stream, 'MAXLEN', conf[1]) end
  if conf[2] then trim_age(stream, now - tonumber(conf[2])) end
  if redis.call('PTTL', stream) == -1 then
    -- The stream was recreated by XADD (e.g. it expired a moment before info did).
    local pttl = redis.call('PTTL', info)
    if pttl > 0 then redis.call('PEXPIRE', stream, pttl) end
  end
  if delayed_push or expires ~= '' or later ~= '' then
    redis.call('PUBLISH', ARGV[o + 2], 'c')
  else
    redis.call('PUBLISH', ARGV[o + 2], first + n - 1)
  end
  return first
end
