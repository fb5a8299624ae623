-- Records a chunk's step and when it is next due, in one atomic step (e.g. "request id recorded + first poll
-- scheduled", or "still running, poll again at T"). Does nothing for a job that has finished meanwhile.
-- Everything is checked before the first write.
-- KEYS: 1 ledger, 2 schedule   ARGV: 1 member, 2 due ms (or "" to leave the schedule alone),
--       3 hincrby field (or ""), then field/value pairs to HSET
local ledger, schedule, chunk_member = KEYS[1], KEYS[2], ARGV[1]
local due, increment = ARGV[2], ARGV[3]
if due ~= '' then uint(due, 'due time') end
if increment == nil then refuse('missing arguments') end
if (#ARGV - 3) % 2 ~= 0 then refuse('fields come in field/value pairs') end
check_type(ledger, 'hash')
check_type(schedule, 'zset')
local state = redis.call('HGET', ledger, F_STATE)
if not state or is_terminal(state) then
  redis.call('ZREM', schedule, chunk_member)
  return 0
end
if increment ~= '' then
  check_counter(redis.call('HGET', ledger, increment), 'the ledger\'s ' .. string.sub(increment, 1, 64))
end

if increment ~= '' then redis.call('HINCRBY', ledger, increment, 1) end
local fields = {}
for i = 4, #ARGV do fields[#fields + 1] = ARGV[i] end
call_sliced('HSET', ledger, {}, fields)
if due ~= '' then redis.call('ZADD', schedule, due, chunk_member) end
return 1
