-- Adds chunks to a running job and schedules them, in one atomic step. Used to split a chunk the API found too
-- large (the chunk is replaced by its first half, the rest becomes new chunks) and to resubmit failed items once
-- (guarded by the `retried` flag, so it happens at most once per job). The job stays within MAX_CHUNKS chunks,
-- and its count of unfinished chunks (F_OPEN_CHUNKS, when the ledger has one) follows. The caller must hold the
-- latest claim of the chunk its step works on (its fencing token, C_CLAIM); a split replaces that very chunk,
-- which must still be submitting. Everything is checked before the first write.
-- KEYS: 1 ledger, 2 schedule
-- ARGV: 1 job id, 2 due ms, 3 replaced chunk index or "" , 4 guard field or "", 5 claimed chunk index,
--       6 claim token, then per chunk:
--       items "start:len", indices JSON or "", requests JSON   (the first triple replaces the chunk when ARGV[3] set)
-- Returns added, guarded (the guard was already set), gone (the job finished or has no ledger), stale (the claim
-- was taken over) or refused (the replaced chunk is no longer submitting)
local ledger, schedule, job_id = KEYS[1], KEYS[2], ARGV[1]
local due, replaced, guard = ARGV[2], ARGV[3], ARGV[4]
uint(due, 'due time')
local replaced_index = replaced ~= '' and uint(replaced, 'replaced chunk index')
if guard == nil then refuse('missing arguments') end
local claimed = uint(ARGV[5], 'claimed chunk index')
local token = uint(ARGV[6], 'claim token')
if replaced_index and replaced_index ~= claimed then refuse('a split replaces the claimed chunk') end
local n_triples = (#ARGV - 6) / 3
if n_triples < 1 or n_triples ~= math.floor(n_triples) then
  refuse('chunks come as items, indices, requests triples; got ' .. (#ARGV - 6) .. ' arguments')
end
for i = 7, #ARGV, 3 do
  check_items(ARGV[i])
  if ARGV[i + 1] ~= '' and not string.match(ARGV[i + 1], '^%[[%d,]*%]$') then
    refuse('chunk indices must be a JSON array of item indices')
  end
  if string.sub(ARGV[i + 2], 1, 1) ~= '[' then refuse('chunk requests must be a JSON array') end
end
check_type(ledger, 'hash')
check_type(schedule, 'zset')
local head = redis.call('HMGET', ledger, F_STATE, F_N_CHUNKS, F_OPEN_CHUNKS, chunk_field(claimed, C_STATE),
  chunk_field(claimed, C_CLAIM))
local state = head[1]
if state and uint(head[5] or '0', 'the chunk\'s ' .. C_CLAIM) ~= token then return ADD_STALE end
if not state or is_terminal(state) then return ADD_GONE end
local n = uint(head[2], 'the ledger\'s ' .. F_N_CHUNKS)
if head[3] then uint(head[3], 'the ledger\'s ' .. F_OPEN_CHUNKS) end
if replaced_index and replaced_index >= n then
  refuse('chunk ' .. replaced_index .. ' is not one of the job\'s ' .. n)
end
if replaced_index and head[4] ~= CHUNK_SUBMITTING then return ADD_REFUSED end
if guard ~= '' and redis.call('HEXISTS', ledger, guard) == 1 then return ADD_GUARDED end
local added = n_triples
if replaced ~= '' then added = added - 1 end
if n + added > MAX_CHUNKS then
  refuse('the job would have ' .. (n + added) .. ' chunks, more than ' .. MAX_CHUNKS)
end

-- A replaced chunk keeps its C_REFERENCES: they are keyed by job index, so the pieces' items find theirs there.
local function write(chunk, items, indices, requests)
  local function f(name) return chunk_field(chunk, name) end
  redis.call('HDEL', ledger, f(C_REQUEST_ID), f(C_OUTPUT), f(C_LAST_ERROR), f(C_INDICES), f(C_REMOTE_STATUS),
    f(C_SUBMITTED_AT))
  redis.call('HSET', ledger, f(C_STATE), CHUNK_PENDING, f(C_ITEMS), items, f(C_REQUESTS), requests,
    f(C_ATTEMPTS), 0, f(C_N_POLLS), 0, f(C_POLL_FAILURES), 0)
  if indices ~= '' then redis.call('HSET', ledger, f(C_INDICES), indices) end
  redis.call('ZADD', schedule, due, member(job_id, chunk))
end
if guard ~= '' then redis.call('HSET', ledger, guard, 1) end
local i = 7
if replaced ~= '' then
  write(replaced_index, ARGV[i], ARGV[i + 1], ARGV[i + 2])
  i = i + 3
end
for k = 0, added - 1 do
  write(n + k, ARGV[i], ARGV[i + 1], ARGV[i + 2])
  i = i + 3
end
redis.call('HSET', ledger, F_N_CHUNKS, n + added, F_UPDATED_AT, due)
if head[3] then redis.call('HINCRBY', ledger, F_OPEN_CHUNKS, added) end
return ADD_ADDED
