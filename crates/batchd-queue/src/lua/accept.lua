-- Accepts one ingress entry as a new job, in one atomic step: create the ledger (each chunk with its own request
-- items), schedule every chunk, and acknowledge + delete the entry. A job id that already has a ledger is a
-- duplicate: the entry is acknowledged and deleted, the ledger counts it, and nothing else happens.
-- KEYS: 1 ledger, 2 submit stream, 3 schedule
-- ARGV: 1 group, 2 entry id, 3 now ms, 4 job id, 5 n_chunks, 6 first-chunk due ms, 7 other-chunks due ms,
--       8.. ledger field/value pairs, then the marker "--chunks", then per chunk: items "start:len", requests JSON
local ledger, stream, schedule = KEYS[1], KEYS[2], KEYS[3]
local group, entry_id, job_id = ARGV[1], ARGV[2], ARGV[4]
local n_chunks, first_due, other_due = tonumber(ARGV[5]), ARGV[6], ARGV[7]

if redis.call('EXISTS', ledger) == 1 then
  redis.call('XACK', stream, group, entry_id)
  redis.call('XDEL', stream, entry_id)
  redis.call('HINCRBY', ledger, 'duplicates', 1)
  return {'duplicate', redis.call('HGET', ledger, 'state') or ''}
end

local i = 8
local fields = {}
while ARGV[i] ~= '--chunks' do
  fields[#fields + 1] = ARGV[i]
  fields[#fields + 1] = ARGV[i + 1]
  i = i + 2
end
redis.call('HSET', ledger, unpack(fields))
for chunk = 0, n_chunks - 1 do
  local prefix = 'c' .. chunk .. ':'
  redis.call('HSET', ledger, prefix .. 'state', 'pending', prefix .. 'items', ARGV[i + 1 + 2 * chunk],
    prefix .. 'requests', ARGV[i + 2 + 2 * chunk], prefix .. 'attempts', 0, prefix .. 'n_polls', 0,
    prefix .. 'poll_failures', 0)
  local due = other_due
  if chunk == 0 then due = first_due end
  redis.call('ZADD', schedule, due, job_id .. '#' .. chunk)
end
redis.call('XACK', stream, group, entry_id)
redis.call('XDEL', stream, entry_id)
return {'accepted', ''}
