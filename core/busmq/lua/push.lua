-- Append messages with consecutive ids (see push_lib.lua for ARGV).
-- KEYS: info, stream, due, delayed[, dedupe key].
-- A producer's last push is kept in info field 'P:<name>' as "<epoch> <sequence> <first
-- id> <count>", for as long as the queue lives: a push of that producer at or below that
-- sequence (same epoch) stores nothing; one with a lower epoch is refused (FENCED).
-- Returns {first id, 1 if this request_id (or producer sequence) was already stored
-- (nothing written) else 0[, count]}: for a producer's duplicate, the first id and count
-- of its last push when that is the one repeated, else {0, 1, 0} (ids not remembered).
local info, stream, dedupe = KEYS[1], KEYS[2], KEYS[5]
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
local n = push_count(0)
local conf, full = push_limits(info, stream, n, 0)
if not conf then return full end
local first = push_write(info, stream, KEYS[3], KEYS[4], conf, n, 0)
if dedupe then redis.call('SET', dedupe, first, 'PX', ARGV[1]) end
if producer then
  redis.call('HSET', info, producer, string.format('%d %d %d %d', epoch, sequence, first, n))
end
return {first, 0}
