-- Stores a finished chunk's output (or failure) and drops it from the schedule; returns how many chunks of the
-- job are still unfinished (0: the caller merges and publishes). Returns -1 when the job already finished.
-- KEYS: 1 ledger, 2 schedule   ARGV: 1 member, 2 chunk index, 3 chunk state (done|failed), 4 output or error, 5 now
local ledger, schedule, member, chunk = KEYS[1], KEYS[2], ARGV[1], ARGV[2]
local state = redis.call('HGET', ledger, 'state')
redis.call('ZREM', schedule, member)
if not state or state == 'completed' or state == 'failed' or state == 'expired' then return -1 end
local prefix = 'c' .. chunk .. ':'
local field = 'output'
if ARGV[3] == 'failed' then field = 'last_error' end
redis.call('HSET', ledger, prefix .. 'state', ARGV[3], prefix .. field, ARGV[4], 'updated_at', ARGV[5])
local n = tonumber(redis.call('HGET', ledger, 'n_chunks'))
local open = 0
for c = 0, n - 1 do
  local s = redis.call('HGET', ledger, 'c' .. c .. ':state')
  if s ~= 'done' and s ~= 'failed' then open = open + 1 end
end
return open
