-- Stores a finished chunk's output (or failure) and returns how many chunks of the job are still unfinished
-- (0: the caller assembles and publishes), or -1 when the job already finished. The chunk leaves the schedule,
-- except the last one: it stays claimed (due again after the lease), so if this replica dies before publishing,
-- another one picks the job up and publishes.
-- KEYS: 1 ledger, 2 schedule
-- ARGV: 1 member, 2 chunk index, 3 chunk state (done|failed), 4 output or error JSON, 5 now ms, 6 lease-until ms
local ledger, schedule, member, chunk = KEYS[1], KEYS[2], ARGV[1], ARGV[2]
local head = redis.call('HMGET', ledger, 'state', 'n_chunks')
if not head[1] or is_terminal(head[1]) then
  redis.call('ZREM', schedule, member)
  return -1
end
local prefix = 'c' .. chunk .. ':'
local field = 'output'
if ARGV[3] == 'failed' then field = 'last_error' end
redis.call('HSET', ledger, prefix .. 'state', ARGV[3], prefix .. field, ARGV[4], 'updated_at', ARGV[5])
local names = {}
for c = 0, tonumber(head[2]) - 1 do names[#names + 1] = 'c' .. c .. ':state' end
local open = 0
for first = 1, #names, 1000 do
  local states = redis.call('HMGET', ledger, unpack(names, first, math.min(first + 999, #names)))
  for _, s in ipairs(states) do
    if s ~= 'done' and s ~= 'failed' then open = open + 1 end
  end
end
if open == 0 then
  redis.call('ZADD', schedule, ARGV[6], member)
else
  redis.call('ZREM', schedule, member)
end
return open
