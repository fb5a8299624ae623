-- Forms (or fills) a pack: takes queued chunks of one packing key, in arrival order, into one remote batch up to
-- the provider's limits. The pack is a ledger of its own (a job id PACK_PREFIX..., one chunk, no result entry)
-- whose chunk 0 is scheduled in the packs' schedule under its first claim; its members are listed in item order.
-- A pack takes members while its one chunk is `pending` (never sent, or every create so far certainly created
-- nothing: waiting for the provider's limits fills it further); once a create is sent (`submitting`) or the chunk
-- was split, its membership is frozen and a call answers PACK_SEALED (with the chunks still queued) and stops it
-- being the key's open pack. A pack created here becomes its packing key's open pack (KEYS[6]), the one later
-- calls fill until it is sealed or full. A candidate that left the queue (another replica
-- packed it), whose job finished (cancelled, expired) or that is not a queued chunk any more is dropped from the
-- queue. Every read and check comes before the first write; at most MAX_PACK_STEP candidates per call.
-- A pack whose cancellation was requested (KEYS[7]: every job in it ended) takes no one either.
-- KEYS: 1 packing queue, 2 packers, 3 pack ledger, 4 pack members list, 5 packs' schedule, 6 open packs, 7 the
--       pack's cancel flag, then per candidate its ledger
-- ARGV: 1 packing key, 2 pack id, 3 now ms, 4 the pack chunk's lease-until ms, 5 most items, 6 most bytes,
--       7 bytes added per item, 8 model, 9 endpoint (or ""), 10 most inputs (or "": the provider does not limit
--       them; a candidate's inputs are its ledger's F_N_INPUTS, summed in the pack's), then per candidate: member,
--       chunk index
-- Returns {verdict, members added, the pack's items, 1 when full (a candidate did not fit), chunks left queued}
-- (a sealed pack: {PACK_SEALED, 0, 0, 0, chunks left queued})
local queue, packers, pack, list, packs, open = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local first_candidate = 7
local key, pack_id = ARGV[1], ARGV[2]
local now = uint(ARGV[3], 'now')
local lease_until = uint(ARGV[4], 'lease end')
local max_items = uint(ARGV[5], 'most items')
local max_bytes = uint(ARGV[6], 'most bytes')
local per_item = uint(ARGV[7], 'bytes per item')
local max_inputs = ARGV[10] ~= '' and uint(ARGV[10], 'most inputs')
local n = #KEYS - first_candidate
if n < 0 or n > MAX_PACK_STEP or #ARGV ~= 10 + 2 * n then
  refuse('0 to ' .. MAX_PACK_STEP .. ' candidates, each with its ledger key, member and chunk index')
end
local head = read_hash(pack, F_STATE, F_N_ITEMS, F_PACK_BYTES, F_PACK_MEMBERS, F_DEADLINE_AT,
  chunk_field(0, C_STATE), F_N_CHUNKS, F_N_INPUTS)
local exists = head[1] ~= false and head[1] ~= nil
if exists and (is_terminal(head[1]) or head[6] ~= CHUNK_PENDING or head[7] ~= '1'
    or typed('string', 'EXISTS', KEYS[7]) == 1) then
  -- Sealed: it stops being the key's open pack, so the next call starts a new one for what is still queued.
  local left = typed('zset', 'ZCARD', queue)
  if typed('hash', 'HGET', open, key) == pack_id then redis.call('HDEL', open, key) end
  return {PACK_SEALED, 0, 0, 0, left}
end
local items, bytes, count, deadline, inputs = 0, 0, 0, 0, 0
if exists then
  items = uint(head[2], 'the pack\'s ' .. F_N_ITEMS)
  bytes = uint(head[3] or '0', 'the pack\'s ' .. F_PACK_BYTES)
  count = uint(head[4] or '0', 'the pack\'s ' .. F_PACK_MEMBERS)
  inputs = uint(head[8] or '0', 'the pack\'s ' .. F_N_INPUTS)
  deadline = tonumber(head[5] or '0') or 0
end
local members = {}
for k = 1, n do members[k] = ARGV[9 + 2 * k] end
local scores = {}
if n > 0 then scores = typed('zset', 'ZMSCORE', queue, unpack(members)) end
typed('zset', 'ZSCORE', packers, key)
typed('zset', 'ZSCORE', packs, member(pack_id, 0))
typed('list', 'LLEN', list)
typed('hash', 'HGET', open, key)

local taken, dropped, full = {}, {}, 0
for k = 1, n do
  if scores[k] then
    local chunk = uint(ARGV[10 + 2 * k], 'chunk index')
    local view = read_hash(KEYS[first_candidate + k], F_STATE, F_DEADLINE_AT, chunk_field(chunk, C_STATE),
      chunk_field(chunk, C_PACK), chunk_field(chunk, C_ITEMS), F_N_INPUTS)
    if not view[1] or is_terminal(view[1]) or view[3] ~= CHUNK_PENDING or view[4] ~= PACK_QUEUED then
      dropped[#dropped + 1] = members[k]
    else
      check_items(view[5])
      local len = tonumber(string.match(view[5], ':(%d+)$'))
      local size = redis.call('HSTRLEN', KEYS[first_candidate + k], chunk_field(chunk, C_REQUESTS)) + len * per_item
      -- A member queued without its inputs counted (by a release before they were) counts one per item.
      local member_inputs = view[6] and uint(view[6], 'a member\'s ' .. F_N_INPUTS) or len
      local over_inputs = max_inputs and inputs + member_inputs > max_inputs
      -- A pack's first member always goes (it was planned within the limits on its own).
      if (items + len > max_items or bytes + size > max_bytes or over_inputs) and (count + #taken) > 0 then
        full = 1
        break
      end
      items, bytes, inputs = items + len, bytes + size, inputs + member_inputs
      -- A deadline may be centuries away (more digits than `uint` takes): compared as a number.
      local member_deadline = tonumber(view[2] or '0') or 0
      if member_deadline > deadline then deadline = member_deadline end
      taken[#taken + 1] = {k = k, chunk = chunk, len = len}
    end
  end
end
if #taken == 0 and not exists then
  if #dropped > 0 then redis.call('ZREM', queue, unpack(dropped)) end
  if redis.call('ZCARD', queue) == 0 then redis.call('ZREM', packers, key) end
  return {PACK_EMPTY, 0, 0, full, redis.call('ZCARD', queue)}
end

local listed, removed = {}, {}
for _, member_taken in ipairs(taken) do
  local ledger = KEYS[first_candidate + member_taken.k]
  redis.call('HSET', ledger, chunk_field(member_taken.chunk, C_PACK), pack_id, F_UPDATED_AT, now)
  listed[#listed + 1] = member_taken.len .. PACK_MEMBER_SEPARATOR .. members[member_taken.k]
  removed[#removed + 1] = members[member_taken.k]
end
for _, dropped_member in ipairs(dropped) do removed[#removed + 1] = dropped_member end
if #listed > 0 then redis.call('RPUSH', list, unpack(listed)) end
if #removed > 0 then redis.call('ZREM', queue, unpack(removed)) end
count = count + #taken
local fields = {F_N_ITEMS, items, F_PACK_BYTES, bytes, F_PACK_MEMBERS, count, F_N_INPUTS, inputs,
  F_DEADLINE_AT, string.format('%.0f', deadline),
  F_UPDATED_AT, now, chunk_field(0, C_ITEMS), '0:' .. items}
if not exists then
  local first = {F_STATE, JOB_ACCEPTED, F_MODEL, ARGV[8], F_PACK_KEY, key, F_ACCEPTED_AT, now, F_N_CHUNKS, 1,
    F_OPEN_CHUNKS, 1, F_REPLY_TO, '', F_PACK_DELIVERED, 0, chunk_field(0, C_STATE), CHUNK_PENDING,
    chunk_field(0, C_ATTEMPTS), 0, chunk_field(0, C_N_POLLS), 0, chunk_field(0, C_POLL_FAILURES), 0,
    chunk_field(0, C_CLAIM), FIRST_CLAIM}
  if ARGV[9] ~= '' then
    first[#first + 1] = F_ENDPOINT
    first[#first + 1] = ARGV[9]
  end
  for _, value in ipairs(first) do fields[#fields + 1] = value end
  redis.call('ZADD', packs, lease_until, member(pack_id, 0))
  redis.call('HSET', open, key, pack_id)
end
redis.call('HSET', pack, unpack(fields))
local left = redis.call('ZCARD', queue)
if left == 0 then redis.call('ZREM', packers, key) end
return {PACK_FORMED, #taken, items, full, left}
