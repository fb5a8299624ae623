-- Publishes a job's one result entry and closes its ledger, in one atomic step. The ledger state is the guard:
-- a job that already finished is never published again, so results are published exactly once per job.
-- KEYS: 1 ledger, 2 results stream, 3 schedule, 4 cancel flag
-- ARGV: 1 final state, 2 now ms, 3 results maxlen, 4 ledger ttl secs, 5 job id, 6 error json (or ""),
--       7 n result pairs, then result field/value pairs
local ledger, results, schedule = KEYS[1], KEYS[2], KEYS[3]
local state = redis.call('HGET', ledger, 'state')
if not state or is_terminal(state) then return 0 end
local n = tonumber(ARGV[7])
local fields = {}
for k = 1, n * 2 do fields[k] = ARGV[7 + k] end
local entry = redis.call('XADD', results, 'MAXLEN', '~', ARGV[3], '*', unpack(fields))
redis.call('HSET', ledger, 'state', ARGV[1], 'finished_at', ARGV[2], 'updated_at', ARGV[2], 'result_entry', entry)
if ARGV[6] ~= '' then redis.call('HSET', ledger, 'error', ARGV[6]) end
local n_chunks = tonumber(redis.call('HGET', ledger, 'n_chunks') or '0')
for c = 0, n_chunks - 1 do
  local prefix = 'c' .. c .. ':'
  redis.call('HDEL', ledger, prefix .. 'output', prefix .. 'requests')
  redis.call('ZREM', schedule, ARGV[5] .. '#' .. c)
  if ARGV[1] == 'completed' then redis.call('HSET', ledger, prefix .. 'state', 'done') end
end
redis.call('EXPIRE', ledger, ARGV[4])
redis.call('DEL', KEYS[4])
return 1
