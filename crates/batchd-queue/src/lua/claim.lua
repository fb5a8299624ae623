-- Claims up to LIMIT due members of the schedule: each is re-scored to now + lease, so a replica that dies
-- while working on it lets it become due again. The cost depends on LIMIT, never on the backlog.
-- KEYS: 1 schedule   ARGV: 1 now ms, 2 lease-until ms, 3 limit
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[3]))
local leased = {}
for _, member in ipairs(due) do
  leased[#leased + 1] = ARGV[2]
  leased[#leased + 1] = member
end
call_sliced('ZADD', KEYS[1], {'XX'}, leased)
return due
