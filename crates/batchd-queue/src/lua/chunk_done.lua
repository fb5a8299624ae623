-- Stores a finished chunk's output (or failure) and returns how many chunks of the job are still unfinished
-- (0: the caller assembles and publishes), or -1 when the job already finished. The chunk leaves the schedule,
-- except the last one: it stays claimed (due again after the lease), so if this replica dies before publishing,
-- another one picks the job up and publishes.
-- The ledger keeps the number of unfinished chunks (F_OPEN_CHUNKS), so a completion costs the same whatever the
-- job's chunk count. A ledger written before that counter existed is counted once, in slices, and then keeps it.
-- Only the holder of the chunk's latest claim (its fencing token, C_CLAIM) may finish it, and only from a state
-- a step finishes it from (submitting, polling, or finished already: the same holder storing it again).
-- Everything is checked before the first write (the ledger is read, the schedule written first).
-- The chunk leaves the remote-batches index (KEYS[3], see transition.lua) whatever the verdict but stale (redis.pcall:
-- the index only feeds a gauge and never fails a completion).
-- KEYS: 1 ledger, 2 schedule, 3 remote batches
-- ARGV: 1 member, 2 chunk index, 3 chunk state (done|failed), 4 output or error JSON, 5 now ms, 6 lease-until ms,
--       7 claim token
-- Returns {verdict, open}: verdict applied (open: the job's chunks still unfinished), gone (the job finished or
-- has no ledger; the member is unscheduled), stale or refused (nothing written)
local ledger, schedule, remote, chunk_member = KEYS[1], KEYS[2], KEYS[3], ARGV[1]
local chunk = uint(ARGV[2], 'chunk index')
if ARGV[3] ~= CHUNK_DONE and ARGV[3] ~= CHUNK_FAILED then
  refuse('chunk state must be ' .. CHUNK_DONE .. ' or ' .. CHUNK_FAILED)
end
if ARGV[4] == nil then refuse('no output or error given') end
uint(ARGV[5], 'now')
uint(ARGV[6], 'lease end')
local token = uint(ARGV[7], 'claim token')
local head = read_hash(ledger, F_STATE, F_N_CHUNKS, F_OPEN_CHUNKS, chunk_field(chunk, C_STATE),
  chunk_field(chunk, C_CLAIM))
if head[1] and uint(head[5] or '0', 'the chunk\'s ' .. C_CLAIM) ~= token then return {FENCE_STALE, -1} end
if not head[1] or is_terminal(head[1]) then
  typed('zset', 'ZREM', schedule, chunk_member)
  redis.pcall('ZREM', remote, chunk_member)
  return {FENCE_GONE, -1}
end
local n = uint(head[2], 'the ledger\'s ' .. F_N_CHUNKS)
if n > MAX_CHUNKS then refuse('the ledger has ' .. n .. ' chunks, more than ' .. MAX_CHUNKS) end
if chunk >= n then refuse('chunk ' .. chunk .. ' is not one of the job\'s ' .. n) end
if head[4] ~= CHUNK_SUBMITTING and head[4] ~= CHUNK_POLLING and not is_finished(head[4]) then
  return {FENCE_REFUSED, -1}
end
local open
if head[3] then
  open = uint(head[3], 'the ledger\'s ' .. F_OPEN_CHUNKS)
else
  open = 0
  for first = 0, n - 1, 1000 do
    local names = {}
    for c = first, math.min(first + 999, n - 1) do names[#names + 1] = chunk_field(c, C_STATE) end
    for _, state in ipairs(redis.call('HMGET', ledger, unpack(names))) do
      if not is_finished(state) then open = open + 1 end
    end
  end
end
if not is_finished(head[4]) and open > 0 then open = open - 1 end

local payload_field = C_OUTPUT
if ARGV[3] == CHUNK_FAILED then payload_field = C_LAST_ERROR end
if open == 0 then
  typed('zset', 'ZADD', schedule, ARGV[6], chunk_member)
else
  typed('zset', 'ZREM', schedule, chunk_member)
end
redis.call('HSET', ledger, chunk_field(chunk, C_STATE), ARGV[3], chunk_field(chunk, payload_field), ARGV[4],
  F_UPDATED_AT, ARGV[5], F_OPEN_CHUNKS, open)
redis.pcall('ZREM', remote, chunk_member)
return {FENCE_APPLIED, open}
