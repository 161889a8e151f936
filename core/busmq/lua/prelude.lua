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

-- The group's last delivered entry, as (ms, seq) of its stream id; nil without a group.
local function last_delivered(stream)
  local ok, groups = pcall(redis.call, 'XINFO', 'GROUPS', stream)
  if not ok then return nil end
  for _, g in ipairs(groups) do
    if g[2] == GROUP then
      local ms, seq = string.match(g[8], '^(%d+)-(%d+)$')
      return tonumber(ms), tonumber(seq)
    end
  end
  return nil
end

-- The oldest entry of a destructive queue still unsettled, as (ms, seq) of its stream id:
-- the first pending, the first parked (a retry, a delivery given back, an entry waiting
-- for its key), or the one after the group's last delivered. Every entry below it was
-- delivered and settled, or read at most once. nil when the stream has no group.
local function settled_floor(stream, parked)
  local floor_ms, floor_seq = last_delivered(stream)
  if not floor_ms then return nil end
  floor_seq = floor_seq + 1
  local pending = redis.call('XPENDING', stream, GROUP, '-', '+', 1)[1]
  if pending then
    local ms, seq = string.match(pending[1], '^(%d+)-(%d+)$')
    ms, seq = tonumber(ms), tonumber(seq)
    if ms < floor_ms or (ms == floor_ms and seq < floor_seq) then floor_ms, floor_seq = ms, seq end
  end
  local first = parked and redis.call('ZRANGE', parked, 0, 0, 'WITHSCORES')[2]
  if first and tonumber(first) <= floor_ms then floor_ms, floor_seq = tonumber(first), 0 end
  return floor_ms, floor_seq
end

-- Trim the entries below settled_floor; how many went (0 without a group).
local function trim_settled(stream, parked)
  local floor_ms, floor_seq = settled_floor(stream, parked)
  if not floor_ms then return 0, nil, nil end
  return redis.call('XTRIM', stream, 'MINID', string.format('%d-%d', floor_ms, floor_seq)), floor_ms, floor_seq
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

-- Processing controls (dead letters, retries, delayed messages). Scripts that use them
-- get KEYS in QueueKeys.all() order, then the dead-letter queue's (with_dead_letters).
local QUEUE_KEYS = 13
local function queue_keys(keys, at)
  return {info = keys[at], stream = keys[at + 1], meta = keys[at + 2], leases = keys[at + 3],
    due = keys[at + 4], delayed = keys[at + 5], alias = keys[at + 6], state = keys[at + 7],
    buckets = keys[at + 8], parked = keys[at + 9], outbox = keys[at + 10],
    held = keys[at + 11], blocked = keys[at + 12],
    all = {unpack(keys, at, at + QUEUE_KEYS - 1)}}
end

local function position(sid) return tonumber(string.match(sid, '^(%d+)')) end

-- Ordering per key (see busmq/ordering.py). `held`: 's:<sid>' -> key for every entry of
-- an ordered key seen and not settled; 'k:<key>' -> the sid that holds the key (the one
-- delivery of the key that may be in flight), then ' <n>' when n entries wait for it.
-- `blocked`: the entries waiting for their key, all scored 0 so that they sort by member:
-- the key's length (5 digits), the key, then the padded stream id; a key's waiting
-- entries are one range, in stream order.
local function key_prefix(key) return string.format('%05d', #key) .. key end

-- `held` also keeps field '~' with a value longer than Redis's hash-max-listpack-value
-- (64 by default), so that Redis stores it as a hash table from the first write: as a
-- listpack (up to hash-max-listpack-entries fields, often 512) every field it reads or
-- writes is a linear scan, and a read of 200 entries cost 2 us per field (measured).
-- Counts from HLEN halve it rounding down, which drops the '~' (order_stats.lua).
local HELD_PIN = '~'
local HELD_PIN_VALUE = string.rep('~', 80)

local function wait_member(key, sid)
  local a, b = string.match(sid, '^(%d+)-(%d+)$')
  return key_prefix(key) .. string.rep('0', 20 - #a) .. a .. string.rep('0', 20 - #b) .. b
end

local function member_sid(member)
  local tail = string.sub(member, 6 + tonumber(string.sub(member, 1, 5)))
  local a = string.match(string.sub(tail, 1, 20), '^0*(%d-%d)$')
  local b = string.match(string.sub(tail, 21), '^0*(%d-%d)$')
  return a .. '-' .. b
end

-- A key's holder and how many wait for it, from its 'k:' value (nil: none holds it).
local function holding(value)
  if not value then return nil, 0 end
  if not string.find(value, ' ', 1, true) then return value, 0 end
  local holder, waiting = string.match(value, '^(%S+) (%d+)$')
  if holder then return holder, tonumber(waiting) end
  return value, 0
end

local function held_value(holder, waiting)
  if waiting > 0 then return holder .. ' ' .. waiting end
  return holder
end

-- Taking keys for the entries of one read (read.lua): the holders of their keys read in
-- one call (prefetch), the writes made in one at the end (flush). A settlement in
-- between writes to Redis itself: flush first (which also forgets what was read).
-- take(key, sid): may entry sid (pending for a consumer) of key go out now? It takes the
-- key if no one holds it; else it leaves the pending list and waits its turn in `blocked`.
local function order_taker(q)
  local t = {}
  local cache, sets, n = {}, {}, 0
  function t.prefetch(keys)
    if #keys == 0 then return end
    local fields = {}
    for i, key in ipairs(keys) do fields[i] = 'k:' .. key end
    local values = redis.call('HMGET', q.held, unpack(fields))
    for i, key in ipairs(keys) do cache[key] = values[i] end
  end
  function t.flush()
    if n > 0 then redis.call('HSET', q.held, HELD_PIN, HELD_PIN_VALUE, unpack(sets, 1, n)) end
    cache, sets, n = {}, {}, 0
  end
  function t.take(key, sid)
    local value = cache[key]
    if value == nil then value = redis.call('HGET', q.held, 'k:' .. key) end
    local holder, waiting = holding(value)
    if holder == sid then return true end
    value = holder and held_value(holder, waiting + 1) or sid
    cache[key] = value
    sets[n + 1], sets[n + 2], sets[n + 3], sets[n + 4] = 's:' .. sid, key, 'k:' .. key, value
    n = n + 4
    if not holder then return true end
    redis.call('XACK', q.stream, GROUP, sid)
    redis.call('ZADD', q.blocked, 0, wait_member(key, sid))
    redis.call('ZADD', q.parked, position(sid), sid)
    return false
  end
  return t
end

local function order_take(q, key, sid)
  local taker = order_taker(q)
  local free = taker.take(key, sid)
  taker.flush()
  return free
end

-- Entries sids are settled (acked, dead-lettered, expired, gone): each that held its key
-- hands it to the key's next waiting entry, made due at once ('o:<sid>' in `due`: read.lua
-- hands it out ahead of new messages); each that was waiting waits no more. A few calls
-- for the whole batch, and one more per key that has waiting entries. Returns true when
-- an entry was made due (the caller announces it: announce_parked).
-- o: a table with the held, blocked, due keys.
local function order_settled_all(o, sids)
  local promoted = false
  for at = 1, #sids, 1000 do
    local batch = #sids <= 1000 and sids or {unpack(sids, at, math.min(at + 999, #sids))}
    local fields = {}
    for i, sid in ipairs(batch) do fields[i] = 's:' .. sid end
    local keys = redis.call('HMGET', o.held, unpack(fields))
    local seen, seen_keys, drop, key_fields = {}, {}, {}, {}
    for i = 1, #batch do
      local key = keys[i]
      if key then
        local n = #seen + 1
        seen[n], seen_keys[n], drop[n] = batch[i], key, fields[i]
        key_fields[n] = 'k:' .. key
      end
    end
    if #seen > 0 then
      local values = redis.call('HMGET', o.held, unpack(key_fields))
      -- The usual case, a holder nobody waits for, frees its key without a table of its
      -- own (`freed_alone`); the rest keeps a key's state in `state`.
      local state, freed_alone = {}, {}
      for i, sid in ipairs(seen) do
        local key = seen_keys[i]
        local current = state[key]
        if freed_alone[key] then
          redis.call('ZREM', o.blocked, wait_member(key, sid))
        elseif not current and values[i] == sid then
          freed_alone[key] = true
          drop[#drop + 1] = key_fields[i]
        else
          if not current then
            local holder, waiting = holding(values[i])
            current = {holder = holder, waiting = waiting, freed = false}
            state[key] = current
          end
          if current.holder == sid then
            current.freed = true
          elseif redis.call('ZREM', o.blocked, wait_member(key, sid)) == 1 then
            current.waiting = current.waiting - 1 -- settled while it waited
          end
        end
      end
      local set = {}
      for key, current in pairs(state) do
        local holder = current.holder
        if current.freed then
          holder = nil
          if current.waiting > 0 then
            local prefix = key_prefix(key)
            local nxt = redis.call('ZRANGEBYLEX', o.blocked, '[' .. prefix, '[' .. prefix .. '\255', 'LIMIT', 0, 1)[1]
            if nxt then
              redis.call('ZREM', o.blocked, nxt)
              holder = member_sid(nxt)
              current.waiting = current.waiting - 1
              redis.call('ZADD', o.due, position(holder), 'o:' .. holder)
              promoted = true
            end
          end
        end
        if holder then
          set[#set + 1] = 'k:' .. key
          set[#set + 1] = held_value(holder, math.max(current.waiting, 0))
        else
          drop[#drop + 1] = 'k:' .. key
        end
      end
      redis.call('HDEL', o.held, unpack(drop))
      if #set > 0 then redis.call('HSET', o.held, unpack(set)) end
    end
  end
  return promoted
end

local function order_settled(o, sid) return order_settled_all(o, {sid}) end

-- The stream id of message id (a delayed message is stored under a later position).
local function stream_id_of(q, id)
  return redis.call('HGET', q.alias, id) or (id .. '-0')
end

-- Forget what the controls kept about a settled stream entry. Returns true when the
-- ordering made another entry due (see order_settled).
local function forget_state(q, sid, fields)
  redis.call('HDEL', q.state, sid, 'f:' .. sid, 'e:' .. sid, 'l:' .. sid, 'w:' .. sid)
  local original = fields and field(fields, 'i')
  if original then redis.call('HDEL', q.alias, original) end
  return order_settled(q, sid)
end

-- A fresh stream position after every id issued so far: "<seq>-<k>".
local function next_position(q)
  local conf = redis.call('HMGET', q.info, 'seq', 'pbase')
  if conf[2] == conf[1] then
    return conf[1] .. '-' .. redis.call('HINCRBY', q.info, 'pk', 1)
  end
  redis.call('HSET', q.info, 'pbase', conf[1], 'pk', 1)
  return conf[1] .. '-1'
end

-- Store delayed message id (due now) in the stream, after everything stored so far.
local function promote_delayed(q, id)
  local packed = redis.call('HGET', q.delayed, id)
  if not packed then return end
  redis.call('HDEL', q.delayed, id)
  -- {payload, kind, pushed ms, headers, expires ms[, schema version]}
  local m = cmsgpack.unpack(packed)
  local sid = next_position(q)
  local args = {'XADD', q.stream, sid, 'p', m[1], 'k', m[2], 't', m[3], 'i', id}
  if m[4] ~= '' then args[#args + 1] = 'h'; args[#args + 1] = m[4] end
  if m[5] ~= '' then args[#args + 1] = 'e'; args[#args + 1] = m[5] end
  if m[6] and m[6] ~= '' then args[#args + 1] = 'sv'; args[#args + 1] = m[6] end
  redis.call(unpack(args))
  redis.call('HSET', q.alias, id, sid)
end

-- Keep a dead-letter queue alive at least as long as its queue.
local function outlive(dq, q)
  local pttl = redis.call('PTTL', q.info)
  if pttl <= 0 then return end
  for _, key in ipairs(dq.all) do
    local own = redis.call('PTTL', key)
    if own ~= -2 and own < pttl then redis.call('PEXPIRE', key, pttl) end
  end
end

-- Move stream entry sid (its fields given) from q to dead-letter queue dq, with headers
-- saying why. Settles it in q (it leaves the pending list and the stream).
local function dead_letter(q, dq, name, sid, fields, reason, count, now, error_text, last)
  local headers = {}
  local raw = field(fields, 'h')
  if raw and raw ~= '' then headers = cjson.decode(raw) end
  local first = redis.call('HGET', q.state, 'f:' .. sid)
  headers['busmq-dead-reason'] = reason
  headers['busmq-dead-queue'] = name
  headers['busmq-dead-id'] = field(fields, 'i') or tostring(position(sid))
  headers['busmq-dead-deliveries'] = tostring(count)
  headers['busmq-dead-at'] = string.format('%d', now)
  if first then headers['busmq-dead-first-delivery'] = first end
  last = last or redis.call('HGET', q.state, 'l:' .. sid)
  if last then headers['busmq-dead-last-delivery'] = string.format('%d', tonumber(last)) end
  error_text = error_text or redis.call('HGET', q.state, 'e:' .. sid)
  if error_text and error_text ~= '' then headers['busmq-dead-error'] = error_text end
  if redis.call('EXISTS', dq.info) == 0 then
    redis.call('DEL', dq.stream, dq.meta, dq.leases)
    redis.call('HSET', dq.info, 'seq', 0, 'created', now,
      'ttl', redis.call('HGET', q.info, 'ttl') or 86400000)
    redis.call('XGROUP', 'CREATE', dq.stream, GROUP, '0', 'MKSTREAM')
  end
  local id = redis.call('HINCRBY', dq.info, 'seq', 1)
  redis.call('XADD', dq.stream, id .. '-0', 'p', field(fields, 'p') or '', 'k',
    field(fields, 'k') or 'b', 't', now, 'h', cjson.encode(headers))
  outlive(dq, q)
  redis.call('PUBLISH', string.sub(dq.info, 1, -2) .. 'n', id)
  redis.call('XACK', q.stream, GROUP, sid)
  redis.call('XDEL', q.stream, sid)
  redis.call('ZREM', q.parked, sid)
  return forget_state(q, sid, fields)
end

-- Park pending entry sid out of the pending list until due_ms, then redeliver it with
-- delivery count count + 1 (deliveries so far: count).
local function park(q, sid, due_ms, count, last)
  redis.call('XACK', q.stream, GROUP, sid)
  redis.call('HSET', q.state, sid, count, 'l:' .. sid, last)
  redis.call('ZADD', q.parked, position(sid), sid)
  redis.call('ZADD', q.due, due_ms, 'r:' .. sid)
end

-- After parking: the parked keys live as long as the queue, and consumers read again in
-- full (see read.lua) to learn when the retry is due.
local function announce_parked(q)
  local pttl = redis.call('PTTL', q.info)
  if pttl > 0 then
    for _, key in ipairs({q.due, q.state, q.parked, q.held, q.blocked}) do
      redis.call('PEXPIRE', key, pttl)
    end
  end
  redis.call('PUBLISH', string.sub(q.info, 1, -2) .. 'n', 'c')
end

-- Give a pending delivery back for redelivery at once: parked as due since long ago,
-- its score its stream position, so the next read of any consumer (read.lua) hands it
-- out ahead of anything else due and of what was stored after it, and deliveries given
-- back (in one call or several: a closing stream's read-ahead, then what it handed out)
-- come back in stream order. Its delivery count is kept (a redelivery adds one).
local function give_back(q, sid, count, last)
  park(q, sid, position(sid), count, last)
end
