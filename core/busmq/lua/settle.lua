-- Settle at-least-once deliveries other than by ack: retry them after a delay, reject
-- them to the dead-letter queue, or release them (given back as they are, for the next
-- read of any consumer: not a failure, so no limit applies; only what is still pending
-- for that consumer: a release is of what it holds and never handed out).
-- KEYS: QueueKeys.with_dead_letters(). ARGV: op ('retry', 'reject' or 'release'), queue name,
-- consumer, delay (ms, or 'policy <initial ms> <factor> <max ms> <jitter multiplier>':
-- initial * factor^(deliveries - 1), at most max, times the multiplier), max_deliveries
-- ('' for the queue's), error text, then ids.
-- A retry of a delivery already made max_deliveries times dead-letters it instead.
-- Returns the ids that were not pending.
local q, dq = queue_keys(KEYS, 1), queue_keys(KEYS, 1 + QUEUE_KEYS)
local op, name, consumer, error_text = ARGV[1], ARGV[2], ARGV[3], ARGV[6]
local initial, factor, max_delay, jitter = string.match(ARGV[4], '^policy (%S+) (%S+) (%S+) (%S+)$')
local function delay_after(count)
  if not initial then return tonumber(ARGV[4]) end
  local base = math.min(tonumber(initial) * tonumber(factor) ^ (count - 1), tonumber(max_delay))
  return math.floor(base * tonumber(jitter))
end
local max_deliveries = tonumber(ARGV[5] ~= '' and ARGV[5] or redis.call('HGET', q.info, 'maxdel') or '')
local now = now_ms()
local unknown = {}
local parked = false
for i = 7, #ARGV do
  local sid = stream_id_of(q, ARGV[i])
  local p = redis.call('XPENDING', q.stream, GROUP, sid, sid, 1)[1]
  local entry = p and redis.call('XRANGE', q.stream, sid, sid)[1]
  if not entry then
    if p then -- trimmed while pending
      redis.call('XACK', q.stream, GROUP, sid)
      parked = order_settled(q, sid) or parked
    end
    unknown[#unknown + 1] = ARGV[i]
  elseif op == 'release' then
    if p[2] == consumer then
      give_back(q, sid, p[4], now - p[3])
      parked = true
    else -- claimed by another consumer since: not this one's to give back
      unknown[#unknown + 1] = ARGV[i]
    end
  else
    local idle, count = p[3], p[4]
    if count == 1 then redis.call('HSETNX', q.state, 'f:' .. sid, now - idle) end
    if op == 'reject' then
      parked = dead_letter(q, dq, name, sid, entry[2], 'rejected', count, now, error_text, now - idle) or parked
    elseif max_deliveries and count >= max_deliveries then
      parked = dead_letter(q, dq, name, sid, entry[2], 'max-deliveries', count, now, error_text, now - idle) or parked
    else
      if error_text ~= '' then redis.call('HSET', q.state, 'e:' .. sid, error_text) end
      local delay = delay_after(count)
      if delay > 0 then
        park(q, sid, now + delay, count, now - idle)
      else
        give_back(q, sid, count, now - idle)
      end
      parked = true
    end
  end
end
if parked then announce_parked(q) end
return unknown
