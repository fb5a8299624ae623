-- Adds chunks to a running job and schedules them, in one atomic step. Used to split a chunk the API found too
-- large (the chunk is replaced by its first half, the rest becomes new chunks) and to resubmit failed items once
-- (guarded by the `retried` flag, so it happens at most once per job).
-- KEYS: 1 ledger, 2 schedule
-- ARGV: 1 job id, 2 due ms, 3 replaced chunk index or "" , 4 guard field or "", then per chunk:
--       items "start:len", indices JSON or "", requests JSON   (the first triple replaces the chunk when ARGV[3] set)
local ledger, schedule, job_id = KEYS[1], KEYS[2], ARGV[1]
local state = redis.call('HGET', ledger, 'state')
if not state or is_terminal(state) then return -1 end
if ARGV[4] ~= '' then
  if redis.call('HSETNX', ledger, ARGV[4], 1) == 0 then return 0 end
end
local n = tonumber(redis.call('HGET', ledger, 'n_chunks'))
local i = 5
local function write(chunk, items, indices, requests)
  local prefix = 'c' .. chunk .. ':'
  redis.call('HDEL', ledger, prefix .. 'request_id', prefix .. 'output', prefix .. 'last_error', prefix .. 'indices',
    prefix .. 'remote_status', prefix .. 'submitted_at')
  redis.call('HSET', ledger, prefix .. 'state', 'pending', prefix .. 'items', items, prefix .. 'requests', requests,
    prefix .. 'attempts', 0, prefix .. 'n_polls', 0, prefix .. 'poll_failures', 0)
  if indices ~= '' then redis.call('HSET', ledger, prefix .. 'indices', indices) end
  redis.call('ZADD', schedule, ARGV[2], job_id .. '#' .. chunk)
end
if ARGV[3] ~= '' then
  write(ARGV[3], ARGV[i], ARGV[i + 1], ARGV[i + 2])
  i = i + 3
end
local added = 0
while i <= #ARGV do
  write(n + added, ARGV[i], ARGV[i + 1], ARGV[i + 2])
  added = added + 1
  i = i + 3
end
redis.call('HSET', ledger, 'n_chunks', n + added, 'updated_at', ARGV[2])
return 1
