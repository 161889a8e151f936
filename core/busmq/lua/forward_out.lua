-- Forward a delivery through its source queue's outbox, step one: record the messages
-- for the target, once per delivery (see busmq.forwarding).
-- KEYS: the source's info, stream, alias, state, parked, outbox.
-- ARGV: [1] the delivery's id, [2] the target's label, [3] the label's entry number up to
-- which every entry is known stored in the target (0: none), [4] a name for the outbox
-- if it has none yet, [5] the stride (1 or 3), then the messages (see push_lib.lua).
-- An outbox entry is "<seq>-0" with fields t (the target's label), x (the stride) and a
-- v per message argument; seq counts up per source queue (info 'oseq'), and info 'oid'
-- names the outbox (a producer in the targets). The delivery's entries are kept in state
-- field 'w:<stream id>' ("<label> <seq> ..." , one per target) until it is acked: a
-- redelivery reuses them.
-- Deletes the label's entries known stored. Returns {seq, oid, the label's other entries
-- up to seq, '' or the entry id where the look stopped short of seq (after 1000
-- entries)}, or {-1} if the delivery is not pending (settled already: nothing recorded).
local info, stream, alias, state, parked, outbox = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local label, through = ARGV[2], ARGV[3] .. '-0'
if through ~= '0-0' then
  for _, e in ipairs(redis.call('XRANGE', outbox, '-', through, 'COUNT', 1000)) do
    if e[2][2] == label then redis.call('XDEL', outbox, e[1]) end
  end
end
local sid = unsettled_sid(stream, alias, parked, ARGV[1])
if not sid then return {-1} end
local noted = redis.call('HGET', state, 'w:' .. sid) or ''
local seq
for l, q in string.gmatch(noted, '(%S+) (%d+)') do
  if l == label then seq = q end
end
if not seq then
  seq = redis.call('HINCRBY', info, 'oseq', 1)
  local entry = {'XADD', outbox, seq .. '-0', 't', ARGV[2], 'x', ARGV[5]}
  for i = 6, #ARGV do entry[#entry + 1] = 'v'; entry[#entry + 1] = ARGV[i] end
  redis.call(unpack(entry))
  redis.call('HSET', state, 'w:' .. sid, noted .. label .. ' ' .. seq .. ' ')
  local pttl = redis.call('PTTL', info)
  if pttl > 0 then redis.call('PEXPIRE', outbox, pttl); redis.call('PEXPIRE', state, pttl) end
end
local oid = redis.call('HGET', info, 'oid')
if not oid then
  oid = ARGV[4]
  redis.call('HSET', info, 'oid', oid)
end
local mine = {}
local scanned = redis.call('XRANGE', outbox, '(' .. through, seq .. '-0', 'COUNT', 1000)
for _, e in ipairs(scanned) do
  if e[2][2] == label then mine[#mine + 1] = e end
end
local last = ''
if #scanned == 1000 and scanned[1000][1] ~= seq .. '-0' then last = scanned[1000][1] end
return {tonumber(seq), oid, mine, last}
