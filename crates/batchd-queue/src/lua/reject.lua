-- Finishes an ingress entry that is not a runnable job, in one atomic step: publish a `failed` result entry,
-- record a finished ledger (so `batchd status` explains it), optionally copy the entry to the dead-letter stream,
-- and acknowledge + delete the entry. An id that already has a ledger is a duplicate and changes nothing.
-- KEYS: 1 ledger, 2 submit stream, 3 results stream, 4 dead-letter stream
-- ARGV: 1 group, 2 entry id, 3 results maxlen, 4 dead maxlen, 5 ledger ttl secs, 6 n result fields (pairs),
--       then result field/value pairs, then n ledger pairs, ledger pairs, then n dead pairs, dead pairs
local ledger, stream, results, dead = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local group, entry_id = ARGV[1], ARGV[2]

if redis.call('EXISTS', ledger) == 1 then
  redis.call('XACK', stream, group, entry_id)
  redis.call('XDEL', stream, entry_id)
  redis.call('HINCRBY', ledger, 'duplicates', 1)
  return 'duplicate'
end

local i = 6
local function take()
  local n = tonumber(ARGV[i])
  local out = {}
  for k = 1, n * 2 do out[k] = ARGV[i + k] end
  i = i + n * 2 + 1
  return out
end
local result_fields = take()
local ledger_fields = take()
local dead_fields = take()

redis.call('XADD', results, 'MAXLEN', '~', ARGV[3], '*', unpack(result_fields))
redis.call('HSET', ledger, unpack(ledger_fields))
redis.call('EXPIRE', ledger, ARGV[5])
if #dead_fields > 0 then
  redis.call('XADD', dead, 'MAXLEN', '~', ARGV[4], '*', unpack(dead_fields))
end
redis.call('XACK', stream, group, entry_id)
redis.call('XDEL', stream, entry_id)
return 'rejected'
