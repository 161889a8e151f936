-- Append messages with consecutive ids.
-- KEYS: info, stream, due, delayed[, dedupe key]. ARGV: dedupe_ms, notify channel, due
-- (Unix ms, '+ms' from now by Redis's clock, '' now), expires (the same; '' never), the
-- stride (1 or 3), the producer ('' or "<epoch> <sequence> <name>"), then per message its
-- payload alone (plain bytes, no headers) or (payload, kind, headers). An entry has no
-- 'k' field when its kind is plain bytes.
-- A message due later keeps its id and waits in `delayed` until a read promotes it.
-- Publishes the last id on the channel to wake idle consumers; 'c' instead for a message
-- due later or expiring, which consumers read in full (see read.lua) from then on.
-- A producer's last push is kept in info field 'P:<name>' as "<epoch> <sequence> <first
-- id> <count>", for as long as the queue lives: a push of that producer at or below that
-- sequence (same epoch) stores nothing; one with a lower epoch is refused (FENCED).
-- Returns {first id, 1 if this request_id (or producer sequence) was already stored
-- (nothing written) else 0[, count]}: for a producer's duplicate, the first id and count
-- of its last push when that is the one repeated, else {0, 1, 0} (ids not remembered).
local info, stream, due_key, delayed, dedupe = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
if redis.call('EXISTS', info) == 0 then return redis.error_reply('NOQUEUE queue does not exist') end
if dedupe then
  local previous = redis.call('GET', dedupe)
  if previous then return {tonumber(previous), 1} end
end
local producer, epoch, sequence
if ARGV[6] ~= '' then
  local e, q, name = string.match(ARGV[6], '^(%d+) (%d+) (.+)$')
  epoch, sequence, producer = tonumber(e), tonumber(q), 'P:' .. name
  local last = redis.call('HGET', info, producer)
  if last then
    local le, lq, lfirst, lcount = string.match(last, '^(%d+) (%d+) (%d+) (%d+)$')
    le, lq = tonumber(le), tonumber(lq)
    if epoch < le then return redis.error_reply('FENCED ' .. le) end
    if epoch == le and sequence <= lq then
      if sequence == lq then return {tonumber(lfirst), 1, tonumber(lcount)} end
      return {0, 1, 0}
    end
  end
end
local stride = tonumber(ARGV[5])
local n = (#ARGV - 6) / stride
local conf = redis.call('HMGET', info, 'maxlen', 'maxage', 'backlog')
if conf[3] and redis.call('XLEN', stream) + n > tonumber(conf[3]) then
  return redis.error_reply('FULL ' .. conf[3])
end
local first = redis.call('HINCRBY', info, 'seq', n) - n + 1
local now = now_ms()
local stamp = string.format('%d', now)
local function absolute(spec)
  if string.sub(spec, 1, 1) == '+' then return string.format('%d', now + tonumber(string.sub(spec, 2))) end
  return spec
end
local due, expires = absolute(ARGV[3]), absolute(ARGV[4])
local delayed_push = due ~= '' and tonumber(due) > now
local function message(i)
  local base = 7 + i * stride
  if stride == 1 then return ARGV[base], 'b', '' end
  return ARGV[base], ARGV[base + 1], ARGV[base + 2]
end
if delayed_push then
  for i = 0, n - 1 do
    local id = tostring(first + i)
    local payload, kind, headers = message(i)
    redis.call('HSET', delayed, id, cmsgpack.pack({payload, kind, stamp, headers, expires}))
    redis.call('ZADD', due_key, due, 'p:' .. id)
  end
  local pttl = redis.call('PTTL', info)
  if pttl > 0 then redis.call('PEXPIRE', delayed, pttl); redis.call('PEXPIRE', due_key, pttl) end
elseif stride == 1 and expires == '' then
  for i = 0, n - 1 do
    redis.call('XADD', stream, string.format('%d-0', first + i), 'p', ARGV[7 + i], 't', stamp)
  end
else
  for i = 0, n - 1 do
    local id = string.format('%d-0', first + i)
    local payload, kind, headers = message(i)
    if headers == '' and expires == '' then
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
if dedupe then redis.call('SET', dedupe, first, 'PX', ARGV[1]) end
if producer then
  redis.call('HSET', info, producer, string.format('%d %d %d %d', epoch, sequence, first, n))
end
if delayed_push or expires ~= '' then
  redis.call('PUBLISH', ARGV[2], 'c')
else
  redis.call('PUBLISH', ARGV[2], first + n - 1)
end
return {first, 0}
