-- Records a chunk's step and when it is next due, in one atomic step (e.g. "request id recorded + first poll
-- scheduled", or "still running, poll again at T"). Does nothing for a job that has finished meanwhile.
-- KEYS: 1 ledger, 2 schedule   ARGV: 1 member, 2 due ms (or "" to leave the schedule alone),
--       3 hincrby field (or ""), then field/value pairs to HSET
local ledger, schedule, member = KEYS[1], KEYS[2], ARGV[1]
local state = redis.call('HGET', ledger, 'state')
if not state or is_terminal(state) then
  redis.call('ZREM', schedule, member)
  return 0
end
if ARGV[3] ~= '' then redis.call('HINCRBY', ledger, ARGV[3], 1) end
if #ARGV > 3 then
  local fields = {}
  for i = 4, #ARGV do fields[#fields + 1] = ARGV[i] end
  redis.call('HSET', ledger, unpack(fields))
end
if ARGV[2] ~= '' then redis.call('ZADD', schedule, ARGV[2], member) end
return 1
