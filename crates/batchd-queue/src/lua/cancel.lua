-- Requests a job's cancellation: sets the cancel flag (also honoured for a job not taken in yet) and makes the
-- job's scheduled chunks due now, so a replica notices at once. Returns the job's state, or "" when unknown.
-- Everything is checked before the first write.
-- KEYS: 1 ledger, 2 cancel flag, 3 schedule   ARGV: 1 job id, 2 flag ttl secs, 3 reason
local ledger, flag, schedule = KEYS[1], KEYS[2], KEYS[3]
if uint(ARGV[2], 'flag ttl') < 1 then refuse('flag ttl must be at least 1 second') end
if ARGV[3] == nil then refuse('missing reason') end
check_type(ledger, 'hash')
check_type(schedule, 'zset')
local head = redis.call('HMGET', ledger, F_STATE, F_N_CHUNKS)
local state = head[1] or ''
if is_terminal(state) then return state end
local n = uint(head[2] or '0', 'the ledger\'s ' .. F_N_CHUNKS)
if n > MAX_CHUNKS then refuse('the ledger has ' .. n .. ' chunks, more than ' .. MAX_CHUNKS) end

redis.call('SET', flag, ARGV[3], 'EX', ARGV[2])
local members = {}
for c = 0, n - 1 do
  members[#members + 1] = 0
  members[#members + 1] = member(ARGV[1], c)
end
call_sliced('ZADD', schedule, {'XX'}, members)
return state
