-- Stores a finished chunk's output (or failure) and returns how many chunks of the job are still unfinished
-- (0: the caller assembles and publishes), or -1 when the job already finished. The chunk leaves the schedule,
-- except the last one: it stays claimed (due again after the lease), so if this replica dies before publishing,
-- another one picks the job up and publishes.
-- The ledger keeps the number of unfinished chunks (OPEN_CHUNKS), so a completion costs the same whatever the
-- job's chunk count. A ledger written before that counter existed is counted once, in slices, and then keeps it.
-- Everything is checked before the first write.
-- KEYS: 1 ledger, 2 schedule
-- ARGV: 1 member, 2 chunk index, 3 chunk state (done|failed), 4 output or error JSON, 5 now ms, 6 lease-until ms
local ledger, schedule, member = KEYS[1], KEYS[2], ARGV[1]
local chunk = uint(ARGV[2], 'chunk index')
if ARGV[3] ~= 'done' and ARGV[3] ~= 'failed' then refuse('chunk state must be done or failed') end
if ARGV[4] == nil then refuse('no output or error given') end
uint(ARGV[5], 'now')
uint(ARGV[6], 'lease end')
check_type(ledger, 'hash')
check_type(schedule, 'zset')
local prefix = 'c' .. chunk .. ':'
local head = redis.call('HMGET', ledger, 'state', 'n_chunks', OPEN_CHUNKS, prefix .. 'state')
if not head[1] or is_terminal(head[1]) then
  redis.call('ZREM', schedule, member)
  return -1
end
local n = uint(head[2], 'the ledger\'s n_chunks')
if n > MAX_CHUNKS then refuse('the ledger has ' .. n .. ' chunks, more than ' .. MAX_CHUNKS) end
if chunk >= n then refuse('chunk ' .. chunk .. ' is not one of the job\'s ' .. n) end
local function finished(state)
  return state == 'done' or state == 'failed'
end
local open
if head[3] then
  open = uint(head[3], 'the ledger\'s ' .. OPEN_CHUNKS)
else
  open = 0
  for first = 0, n - 1, 1000 do
    local names = {}
    for c = first, math.min(first + 999, n - 1) do names[#names + 1] = 'c' .. c .. ':state' end
    for _, state in ipairs(redis.call('HMGET', ledger, unpack(names))) do
      if not finished(state) then open = open + 1 end
    end
  end
end
if not finished(head[4]) and open > 0 then open = open - 1 end

local field = 'output'
if ARGV[3] == 'failed' then field = 'last_error' end
redis.call('HSET', ledger, prefix .. 'state', ARGV[3], prefix .. field, ARGV[4], 'updated_at', ARGV[5],
  OPEN_CHUNKS, open)
if open == 0 then
  redis.call('ZADD', schedule, ARGV[6], member)
else
  redis.call('ZREM', schedule, member)
end
return open
