-- Settling a delivery by ack: shared by ack.lua, ack_upto.lua and the forward scripts.

-- The keys an ack touches (QueueKeys.ack_keys), from KEYS[at].
local function ack_keys(keys, at)
  return {stream = keys[at], alias = keys[at + 1], state = keys[at + 2], due = keys[at + 3],
    parked = keys[at + 4], held = keys[at + 5], blocked = keys[at + 6], info = keys[at + 7]}
end

-- Given back (a nack, a released stream) or waiting for a retry and not redelivered
-- yet: a late ack of its holder still settles it.
local function was_parked(due, parked, sid)
  if redis.call('ZREM', parked, sid) == 0 then return false end
  redis.call('ZREM', due, 'r:' .. sid, 'o:' .. sid)
  return true
end

-- Ack delayed message id, stored under a later position than its id: that position if
-- it was pending (or parked), else nil.
local function ack_moved(stream, alias, due, parked, id)
  local moved = redis.call('HGET', alias, id)
  if moved and (redis.call('XACK', stream, GROUP, moved) == 1 or was_parked(due, parked, moved)) then
    redis.call('HDEL', alias, id)
    return moved
  end
  return nil
end

-- Ack message id; the stream id it was pending (or parked) under, or nil if it was not.
local function ack_find(stream, alias, due, parked, id)
  local sid = id .. '-0'
  if redis.call('XACK', stream, GROUP, sid) == 1 or was_parked(due, parked, sid) then
    return sid
  end
  return ack_moved(stream, alias, due, parked, id)
end

local function at_or_before(a_ms, a_seq, b_ms, b_seq)
  return a_ms < b_ms or (a_ms == b_ms and a_seq <= b_seq)
end

-- Ack message ids: the stream ids acked (pending or parked), and the ids that were
-- neither. One XACK for all of them (an XACK an id cost Lua 0.6 us an id more): when it
-- acks as many as it was given, each was pending. Otherwise the ones it acked are told by
-- what it leaves: an entry that is still in the stream, was delivered and is not parked
-- was pending until this XACK (the one other such entry, one read at-most-once whose
-- delete is deferred, is counted acked: it goes anyway), and so was an entry trimmed
-- away that an ordered queue still lists as unsettled; the rest may be delayed messages
-- (ack_moved).
-- (An unordered entry trimmed while pending is then unknown, where alone it is acked.)
local function ack_all(a, ids)
  local sids = {}
  for i, id in ipairs(ids) do sids[i] = id .. '-0' end
  local taken = 0
  for i = 1, #sids, 1000 do
    taken = taken + redis.call('XACK', a.stream, GROUP, unpack(sids, i, math.min(i + 999, #sids)))
  end
  if taken == #sids then return sids, {} end
  local acked, unknown, seen = {}, {}, {}
  local upto_ms, upto_seq = last_delivered(a.stream)
  for i, sid in ipairs(sids) do
    local id = ids[i]
    local found = nil
    if not seen[sid] then -- the XACK took an id given twice once; the second is unknown
      seen[sid] = true
      if was_parked(a.due, a.parked, sid) then
        found = sid
      elseif taken > 0 and upto_ms and tonumber(id) and at_or_before(tonumber(id), 0, upto_ms, upto_seq)
          and (#redis.call('XRANGE', a.stream, sid, sid) > 0
            or redis.call('HEXISTS', a.held, 's:' .. sid) == 1) then
        found = sid -- (or trimmed while pending: an ordered one still holds its key)
      else
        found = ack_moved(a.stream, a.alias, a.due, a.parked, id)
      end
    end
    if found then acked[#acked + 1] = found else unknown[#unknown + 1] = id end
  end
  return acked, unknown
end

-- Delete acked entries from the stream. First what lies below the oldest entry still
-- unsettled goes with one XTRIM MINID (trim_settled), which drops whole nodes and walks
-- at most one; XDEL, which walks its entry's node from the start (2-3 us an entry, the
-- largest part of an ack), then deletes only those above it. An ordered queue's waiting
-- entries often hold that floor down: the trim removes nothing and the ack pays its
-- three lookups (not per message) for nothing.
local TRIM_FROM = 16 -- acked entries: below, the trim's lookups cost more than it saves

local function delete_acked(a, acked)
  local trimmed, floor_ms, floor_seq = 0, nil, nil
  if #acked >= TRIM_FROM then trimmed, floor_ms, floor_seq = trim_settled(a.stream, a.parked) end
  if trimmed > 0 then
    local rest = {}
    for _, sid in ipairs(acked) do
      local dash = string.find(sid, '-', 1, true)
      local ms = tonumber(string.sub(sid, 1, dash - 1))
      if ms > floor_ms or (ms == floor_ms and tonumber(string.sub(sid, dash + 1)) >= floor_seq) then
        rest[#rest + 1] = sid
      end
    end
    acked = rest
  end
  for i = 1, #acked, 1000 do
    redis.call('XDEL', a.stream, unpack(acked, i, math.min(i + 999, #acked)))
  end
end

-- Delete acked entries and what was kept about them (retries, forwarding, the ordering:
-- an acked entry frees its key for the key's next message).
local function ack_forget(a, acked)
  if #acked == 0 then return end
  delete_acked(a, acked)
  if redis.call('EXISTS', a.state) == 1 then
    for _, sid in ipairs(acked) do
      redis.call('HDEL', a.state, sid, 'f:' .. sid, 'e:' .. sid, 'l:' .. sid, 'w:' .. sid)
    end
  end
  if redis.call('EXISTS', a.held) == 1 and order_settled_all(a, acked) then -- ordered per key
    announce_parked(a)
  end
end

-- The stream id under which message id is pending or parked (unsettled), or nil.
local function unsettled_sid(stream, alias, parked, id)
  local sid = redis.call('HGET', alias, id) or (id .. '-0')
  if #redis.call('XPENDING', stream, GROUP, sid, sid, 1) > 0 then return sid end
  if redis.call('ZSCORE', parked, sid) then return sid end
  return nil
end
