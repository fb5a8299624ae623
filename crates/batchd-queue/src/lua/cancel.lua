-- Requests a job's cancellation: sets the cancel flag (also honoured for a job not taken in yet) and makes the
-- job's scheduled chunks due now, so a replica notices at once. Returns the job's state, or "" when unknown.
-- KEYS: 1 ledger, 2 cancel flag, 3 schedule   ARGV: 1 job id, 2 flag ttl secs, 3 reason
local state = redis.call('HGET', KEYS[1], 'state') or ''
if is_terminal(state) then return state end
redis.call('SET', KEYS[2], ARGV[3], 'EX', ARGV[2])
local n = tonumber(redis.call('HGET', KEYS[1], 'n_chunks') or '0')
for c = 0, n - 1 do
  redis.call('ZADD', KEYS[3], 'XX', 0, ARGV[1] .. '#' .. c)
end
return state
