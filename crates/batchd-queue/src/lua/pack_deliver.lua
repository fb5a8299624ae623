-- Hands a finished pack's results to a run of its members, in one atomic step per run: each member chunk still
-- waiting for this pack (C_PACK = the pack's id, not finished, its job not finished) gets its output (or its
-- failure), the pack's request id, and leaves the job's count of unfinished chunks; a job with none left is due
-- at once (its step publishes it), otherwise the chunk leaves the schedule (it was there only for its deadline).
-- A member whose job already ended (cancelled, expired) or that another delivery reached first is skipped, so a
-- delivery repeated after a crash changes nothing. The pack's cursor (F_PACK_DELIVERED) says where the next run
-- starts; a caller whose cursor is not the pack's (another replica delivered meanwhile) is told DELIVER_MOVED.
-- Every read and check comes before the first write; at most MAX_PACK_STEP members per run.
-- KEYS: 1 pack ledger, 2 schedule, then per member its ledger
-- ARGV: 1 pack id, 2 now ms, 3 request id, 4 the caller's cursor, then per member: member, chunk index,
--       chunk state (done|failed), output or error JSON
-- Returns {verdict, the pack's cursor after the run, members delivered}
local pack, schedule = KEYS[1], KEYS[2]
local pack_id = ARGV[1]
local now = uint(ARGV[2], 'now')
local cursor = uint(ARGV[4], 'cursor')
local n = #KEYS - 2
if n < 1 or n > MAX_PACK_STEP or #ARGV ~= 4 + 4 * n then
  refuse('1 to ' .. MAX_PACK_STEP .. ' members, each with its ledger key, member, chunk index, state and payload')
end
local head = read_hash(pack, F_STATE, F_PACK_DELIVERED)
if not head[1] then return {DELIVER_GONE, 0, 0} end
local at = uint(head[2] or '0', 'the pack\'s ' .. F_PACK_DELIVERED)
if at ~= cursor then return {DELIVER_MOVED, at, 0} end
typed('zset', 'ZSCORE', schedule, '')
local deliver = {}
for k = 1, n do
  local base = 4 + 4 * (k - 1)
  local chunk = uint(ARGV[base + 2], 'chunk index')
  local state = ARGV[base + 3]
  if state ~= CHUNK_DONE and state ~= CHUNK_FAILED then
    refuse('chunk state must be ' .. CHUNK_DONE .. ' or ' .. CHUNK_FAILED)
  end
  local view = read_hash(KEYS[2 + k], F_STATE, F_OPEN_CHUNKS, chunk_field(chunk, C_STATE),
    chunk_field(chunk, C_PACK))
  if view[1] and not is_terminal(view[1]) and view[4] == pack_id and not is_finished(view[3]) then
    local open = uint(view[2] or '1', 'the ledger\'s ' .. F_OPEN_CHUNKS)
    deliver[#deliver + 1] = {k = k, chunk = chunk, state = state, payload = ARGV[base + 4], open = open,
      member = ARGV[base + 1]}
  end
end

for _, member_delivered in ipairs(deliver) do
  local open = member_delivered.open
  if open > 0 then open = open - 1 end
  local payload_field = C_OUTPUT
  if member_delivered.state == CHUNK_FAILED then payload_field = C_LAST_ERROR end
  local chunk = member_delivered.chunk
  redis.call('HSET', KEYS[2 + member_delivered.k], chunk_field(chunk, C_STATE), member_delivered.state,
    chunk_field(chunk, payload_field), member_delivered.payload, chunk_field(chunk, C_REQUEST_ID), ARGV[3],
    F_OPEN_CHUNKS, open, F_UPDATED_AT, now)
  if open == 0 then
    redis.call('ZADD', schedule, now, member_delivered.member)
  else
    redis.call('ZREM', schedule, member_delivered.member)
  end
end
redis.call('HSET', pack, F_PACK_DELIVERED, cursor + n, F_UPDATED_AT, now)
return {DELIVER_DELIVERED, cursor + n, #deliver}
