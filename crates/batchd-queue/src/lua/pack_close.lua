-- Closes a pack once its results were handed to every member (or it ended without results): its ledger is
-- finished (no result entry: a pack's members publish their own), its chunks leave the packs' schedule and the
-- remote-batches index, and the ledger and its members list expire with the usual ledger TTL. A pack already
-- closed is left alone (answer 0). Checked before the first write.
-- KEYS: 1 pack ledger, 2 packs' schedule, 3 members list, 4 remote batches
-- ARGV: 1 final state, 2 now ms, 3 ledger ttl secs, 4 pack id
-- Returns 1 (closed) or 0 (already closed or gone)
local pack, packs, list, remote = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
if not is_terminal(ARGV[1]) then refuse('final state must be a terminal job state') end
uint(ARGV[2], 'now')
if uint(ARGV[3], 'ledger ttl') < 1 then refuse('ledger ttl must be at least 1 second') end
local head = read_hash(pack, F_STATE, F_N_CHUNKS)
if not head[1] or is_terminal(head[1]) then return 0 end
local n_chunks = uint(head[2] or '0', 'the pack\'s ' .. F_N_CHUNKS)
if n_chunks > MAX_CHUNKS then refuse('the pack has ' .. n_chunks .. ' chunks, more than ' .. MAX_CHUNKS) end
typed('zset', 'ZSCORE', packs, '')
typed('list', 'LLEN', list)
local chunks = {}
for c = 0, n_chunks - 1 do chunks[#chunks + 1] = member(ARGV[4], c) end
redis.call('HSET', pack, F_STATE, ARGV[1], F_FINISHED_AT, ARGV[2], F_UPDATED_AT, ARGV[2])
call_sliced('ZREM', packs, {}, chunks)
for first = 1, #chunks, 1000 do
  local slice = {}
  for k = first, math.min(first + 999, #chunks) do slice[#slice + 1] = chunks[k] end
  redis.pcall('ZREM', remote, unpack(slice))
end
redis.call('EXPIRE', pack, ARGV[3])
redis.call('EXPIRE', list, ARGV[3])
return 1
