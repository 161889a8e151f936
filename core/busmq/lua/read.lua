-- Read for a destructive consumer (at-most-once or at-least-once), with the processing
-- controls applied atomically: pause, the queue's rate limit, due retries and delayed
-- messages, expiry, the per-key rate limit and the ordering per key (prelude.lua).
-- KEYS: QueueKeys.with_dead_letters(). ARGV: consumer, count, noack ('1' at-most-once),
-- queue name.
-- Returns {entries, retried, wait, lean, last}: entries flat, each its id, its number of
-- fields and names and values, all in one array (two tables an entry cost Redis 1.5 us an
-- entry more to return: it looks up the special fields, err, ok and RESP3's, of each),
-- retried as {id, fields, delivery count}, wait: -2 paused, -1 nothing scheduled, else ms
-- until something (a retry, a delayed message, a rate-limit token) is due; lean is 1 when
-- nothing here applies to the queue (no control set, nothing scheduled, no promoted
-- message waiting): the consumer may then read with a plain XREADGROUP until told that
-- this changed (a 'c' publication on the queue's channel, see notifier.py); last: the
-- position (the id's first part) of the last entry the XREADGROUP read, handed out or
-- not (0: none), so that a publication of an id up to it is no news (WakeUp.cover).
local q, dq = queue_keys(KEYS, 1), queue_keys(KEYS, 1 + QUEUE_KEYS)
local consumer, want, noack, name = ARGV[1], tonumber(ARGV[2]), ARGV[3] == '1', ARGV[4]
local conf = redis.call('HMGET', q.info, 'paused', 'rate', 'tk', 'tt', 'krate', 'expiring',
  'expdrop', 'order', 'later')
if conf[1] then return {{}, {}, -2} end
local order = conf[8]
if order and noack then
  return redis.error_reply('ORDERED queue ' .. name .. ' is ordered by header ' .. order ..
    ': its consumers must be at-least-once')
end
local now = now_ms()
local wait = -1
local function sooner(ms) if wait < 0 or ms < wait then wait = ms end end

-- The queue's token bucket: `rate` is "limit per_ms"; tokens and their time in tk/tt.
local allowance, tokens, limit, per = want, nil, nil, nil
if conf[2] then
  limit, per = string.match(conf[2], '^(%S+) (%S+)$')
  limit, per = tonumber(limit), tonumber(per)
  tokens = math.min(limit, tonumber(conf[3] or limit) + (now - tonumber(conf[4] or now)) * limit / per)
  allowance = math.min(want, math.floor(tokens))
  if allowance < 1 then return {{}, {}, math.max(1, math.ceil((1 - tokens) * per / limit))} end
end

local retried, promoted = {}, {}
local announce = false -- the ordering made an entry due: wake every consumer
local touched = false -- parked or blocked here: the keys that hold them live with the queue
-- An entry's headers (its fields), decoded, or nil.
local function headers_of(fields)
  local raw = field(fields, 'h')
  if raw and raw ~= '' then return cjson.decode(raw) end
  return nil
end
-- The ordering key in decoded headers, or nil.
local function order_key(headers)
  local value = headers and headers[order]
  if type(value) == 'string' then return value end
  return nil
end
if redis.call('EXISTS', q.due) == 1 then
  for _, member in ipairs(redis.call('ZRANGEBYSCORE', q.due, '-inf', now, 'LIMIT', 0, allowance)) do
    redis.call('ZREM', q.due, member)
    local ref = string.sub(member, 3)
    local kind = string.sub(member, 1, 1)
    if kind == 'p' then
      promote_delayed(q, ref)
    elseif kind == 'o' then
      -- Its key's turn (order_settled): a first delivery, filtered below like a new entry.
      redis.call('ZREM', q.parked, ref)
      local claimed = redis.call('XCLAIM', q.stream, GROUP, consumer, 0, ref, 'RETRYCOUNT', 1, 'FORCE')
      if claimed[1] and claimed[1][2] then
        promoted[#promoted + 1] = claimed[1]
      else -- trimmed while it waited
        announce = order_settled(q, ref) or announce
      end
    else
      redis.call('ZREM', q.parked, ref)
      local count = tonumber(redis.call('HGET', q.state, ref) or '0') + 1
      local claimed = redis.call('XCLAIM', q.stream, GROUP, consumer, 0, ref, 'RETRYCOUNT', count, 'FORCE')
      redis.call('HDEL', q.state, ref)
      if claimed[1] and claimed[1][2] then
        local key = order and order_key(headers_of(claimed[1][2]))
        if key and not order_take(q, key, ref) then
          touched = true -- waits behind its key (parked before the ordering was set)
        else
          retried[#retried + 1] = {claimed[1][1], claimed[1][2], count}
          if noack then
            redis.call('XACK', q.stream, GROUP, ref)
            redis.call('XDEL', q.stream, ref)
            forget_state(q, ref, claimed[1][2])
          end
        end
      else
        announce = order_settled(q, ref) or announce
      end
    end
  end
  local head = redis.call('ZRANGE', q.due, 0, 0, 'WITHSCORES')
  if head[2] then sooner(math.max(1, tonumber(head[2]) - now)) end
end

local entries = promoted
local room = allowance - #retried - #promoted
local last = 0
if room > 0 then
  local read = {'XREADGROUP', 'GROUP', GROUP, consumer, 'COUNT', room}
  if noack then read[#read + 1] = 'NOACK' end
  read[#read + 1] = 'STREAMS'; read[#read + 1] = q.stream; read[#read + 1] = '>'
  local reply = redis.pcall(unpack(read))
  if type(reply) == 'table' and reply.err then return reply end -- NOGROUP: the caller recreates it
  if reply then
    local got = reply[1][2]
    for _, entry in ipairs(got) do entries[#entries + 1] = entry end
    if #got > 0 then last = position(got[#got][1]) end
  end
end

-- Expired messages, those whose key is held by an earlier one, those due later ('l':
-- a delayed push to an ordered queue, stored in place) and those over their key's rate
-- limit do not go out.
if #entries > 0 and (conf[5] or conf[6] or order or conf[9]) then
  local header, klimit, kper
  if conf[5] then
    header, klimit, kper = string.match(conf[5], '^(.-) (%S+) (%S+)$')
    klimit, kper = tonumber(klimit), tonumber(kper)
  end
  local kept, tokens_of = {}, {}
  local decoded, taker = {}, order and order_taker(q)
  if header or order then
    local keys, listed = {}, {}
    for i, entry in ipairs(entries) do
      decoded[i] = headers_of(entry[2]) or false
      local okey = order and order_key(decoded[i] or nil)
      if okey and not listed[okey] then
        listed[okey] = true
        keys[#keys + 1] = okey
      end
    end
    if taker then taker.prefetch(keys) end
  end
  for i, entry in ipairs(entries) do
    local sid, fields = entry[1], entry[2]
    local expires = conf[6] and field(fields, 'e')
    local later = conf[9] and field(fields, 'l')
    local headers = decoded[i] or nil
    local okey = order and order_key(headers)
    local key = header and headers and headers[header]
    if expires and tonumber(expires) <= now then
      if taker then taker.flush() end -- the settlement below reads and writes `held`
      if conf[7] then
        redis.call('XACK', q.stream, GROUP, sid)
        redis.call('XDEL', q.stream, sid)
        announce = forget_state(q, sid, fields) or announce
      else
        announce = dead_letter(q, dq, name, sid, fields, 'expired', 0, now, nil, nil) or announce
      end
    elseif okey and not taker.take(okey, sid) then
      touched = true -- waits in `blocked` for its key
    elseif later and tonumber(later) > now then
      -- Holds its key (taken above) and its place until due; then a first delivery.
      park(q, sid, tonumber(later), 0, now)
      sooner(tonumber(later) - now)
      touched = true
    elseif key then
      local have = tokens_of[key]
      if not have then
        local state = redis.call('HGET', q.buckets, key)
        local at = now
        have = klimit
        if state then
          local t, s = string.match(state, '^(%S+) (%S+)$')
          have, at = tonumber(t), tonumber(s)
        end
        have = math.min(klimit, have + (now - at) * klimit / kper)
      end
      tokens_of[key] = have - 1
      if have >= 1 then
        kept[#kept + 1] = entry
      else
        -- Not a delivery: it waits (keeping its count) for the token it reserves now,
        -- the bucket going below zero; later messages of the key queue up behind it.
        local ready = now + math.ceil((1 - have) * kper / klimit)
        park(q, sid, ready + i / 1000, 0, now)
        sooner(ready - now)
      end
    else
      kept[#kept + 1] = entry
    end
  end
  entries = kept
  if taker then taker.flush() end
  for key, have in pairs(tokens_of) do redis.call('HSET', q.buckets, key, have .. ' ' .. now) end
  if conf[5] then
    local pttl = redis.call('PTTL', q.info)
    if pttl > 0 then redis.call('PEXPIRE', q.buckets, pttl) end
  end
end
if order and #entries > 0 then touched = true end -- `held` may be new
if announce then
  announce_parked(q)
elseif touched then
  local pttl = redis.call('PTTL', q.info)
  if pttl > 0 then
    for _, k in ipairs({q.due, q.state, q.parked, q.held, q.blocked}) do redis.call('PEXPIRE', k, pttl) end
  end
end

if noack and #entries > 0 then
  local ids = {}
  for i, entry in ipairs(entries) do
    ids[i] = entry[1]
    local original = field(entry[2], 'i')
    if original then redis.call('HDEL', q.alias, original) end
  end
  for i = 1, #ids, 1000 do redis.call('XDEL', q.stream, unpack(ids, i, math.min(i + 999, #ids))) end
end
if tokens then
  redis.call('HSET', q.info, 'tk', tokens - #entries - #retried, 'tt', now)
end
local lean = 0
if not (conf[2] or conf[5] or conf[6] or order or conf[9]) and wait == -1
    and redis.call('EXISTS', q.due, q.alias) == 0 then
  lean = 1
end
local flat, n = {}, 0
for _, entry in ipairs(entries) do
  local fields = entry[2]
  local count = #fields
  flat[n + 1], flat[n + 2] = entry[1], count
  for j = 1, count do flat[n + 2 + j] = fields[j] end
  n = n + 2 + count
end
return {flat, retried, wait, lean, last}
