-- Claims up to LIMIT due members of the schedule: each is re-scored to now + lease, so a replica that dies
-- while working on it lets it become due again. The cost depends on LIMIT (at most MAX_LIMIT), never on the
-- backlog. Everything is checked before the first write.
-- KEYS: 1 schedule   ARGV: 1 now ms, 2 lease-until ms, 3 limit
uint(ARGV[1], 'now')
uint(ARGV[2], 'lease end')
local limit = uint(ARGV[3], 'limit')
if limit < 1 or limit > MAX_LIMIT then refuse('limit must be 1 to ' .. MAX_LIMIT) end
check_type(KEYS[1], 'zset')
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, limit)
local leased = {}
for _, member in ipairs(due) do
  leased[#leased + 1] = ARGV[2]
  leased[#leased + 1] = member
end
call_sliced('ZADD', KEYS[1], {'XX'}, leased)
return due
