-- Move dead letters back to their queue, as new messages (new ids, at the end: the
-- consumer group has moved past their old positions). Their headers lose the
-- busmq-dead-* entries and gain busmq-requeued-id (the id they had in the queue).
-- KEYS: QueueKeys.with_dead_letters() of the queue. ARGV: limit (0: none), the token of
-- the schema version the listed ids were checked against ('' none: refused with SCHEMA
-- <current> when the queue has one, as a push is), R, then R pairs (dead-letter id, why)
-- of those that do not fit that version, then the dead-letter ids to move. With a token
-- the caller lists them all; without, none listed means every one, oldest first, up to
-- limit.
-- Those that do not fit die again: a new dead-letter id, reason 'schema', the why in
-- busmq-dead-error.
-- Returns the ids the moved messages have in the queue now.
local q, dq = queue_keys(KEYS, 1), queue_keys(KEYS, 1 + QUEUE_KEYS)
if redis.call('EXISTS', q.info) == 0 then return redis.error_reply('NOQUEUE queue does not exist') end
local version = ARGV[2]
local current = redis.call('HGET', q.info, 'schema') or ''
if current ~= version then return redis.error_reply('SCHEMA ' .. current) end
local now = string.format('%d', now_ms())
local refused = tonumber(ARGV[3])
local first = 4 + 2 * refused

local function dead_letter_entry(id)
  return redis.call('XRANGE', dq.stream, id .. '-0', id .. '-0')[1]
end

-- Dead again, for the schema: the same fields (in their order), new headers.
for i = 4, first - 1, 2 do
  local entry = dead_letter_entry(ARGV[i])
  if entry then
    local raw = field(entry[2], 'h')
    local headers = {}
    if raw and raw ~= '' then headers = cjson.decode(raw) end
    headers['busmq-dead-reason'] = 'schema'
    headers['busmq-dead-error'] = ARGV[i + 1]
    headers['busmq-dead-at'] = now
    local fields, placed = {}, false
    for j = 1, #entry[2], 2 do
      local name = entry[2][j]
      if name ~= 'h' then
        fields[#fields + 1] = name
        fields[#fields + 1] = entry[2][j + 1]
      end
      if name == 't' then
        fields[#fields + 1] = 'h'
        fields[#fields + 1] = cjson.encode(headers)
        placed = true
      end
    end
    if not placed then
      fields[#fields + 1] = 'h'
      fields[#fields + 1] = cjson.encode(headers)
    end
    local id = redis.call('HINCRBY', dq.info, 'seq', 1)
    redis.call('XADD', dq.stream, id .. '-0', unpack(fields))
    redis.call('XACK', dq.stream, GROUP, entry[1])
    redis.call('XDEL', dq.stream, entry[1])
  end
end

local entries = {}
if version ~= '' or #ARGV >= first then
  for i = first, #ARGV do
    local entry = dead_letter_entry(ARGV[i])
    if entry then entries[#entries + 1] = entry end
  end
else
  local limit = tonumber(ARGV[1])
  if limit > 0 then
    entries = redis.call('XRANGE', dq.stream, '-', '+', 'COUNT', limit)
  else
    entries = redis.call('XRANGE', dq.stream, '-', '+')
  end
end
local ids = {}
for _, entry in ipairs(entries) do
  local raw = field(entry[2], 'h')
  local headers = {}
  if raw and raw ~= '' then headers = cjson.decode(raw) end
  local original = headers['busmq-dead-id']
  for key, _ in pairs(headers) do
    if string.sub(key, 1, 11) == 'busmq-dead-' then headers[key] = nil end
  end
  if original then headers['busmq-requeued-id'] = original end
  local encoded = next(headers) and cjson.encode(headers) or ''
  local id = redis.call('HINCRBY', q.info, 'seq', 1)
  local args = {'XADD', q.stream, id .. '-0', 'p', field(entry[2], 'p') or '', 'k',
    field(entry[2], 'k') or 'b', 't', now, 'h', encoded}
  if version ~= '' then args[#args + 1] = 'sv'; args[#args + 1] = string.match(version, '^(%d+)') end
  redis.call(unpack(args))
  redis.call('XACK', dq.stream, GROUP, entry[1])
  redis.call('XDEL', dq.stream, entry[1])
  ids[#ids + 1] = id
end
if #ids > 0 then redis.call('PUBLISH', string.sub(q.info, 1, -2) .. 'n', ids[#ids]) end
return ids
