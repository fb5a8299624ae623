-- Finishes an ingress entry that is not a runnable job, in one atomic step: publish a `failed` result entry,
-- record a finished ledger (so `batchd status` explains it), optionally copy the entry to the dead-letter stream,
-- and acknowledge + delete the entry. An id that already has a ledger is a duplicate: its ledger counts it and
-- no second result is published (a dead-letter copy, when given, is still written: the entry is not lost).
-- With a delivery guard N > 0 (an entry taken in too many times), all this happens only if the entry is still
-- pending with more than N deliveries; otherwise nothing is done ("gone": another replica finished it).
-- The caller bounds the dead-letter copy (the original fields, cut to a byte budget); every list is at most
-- MAX_PAIRS pairs, so no `unpack` exceeds Lua's limit. Everything is checked before the first write.
-- A rejected job is counted in the finished-jobs counters in the same step (see count_finished).
-- KEYS: 1 ledger, 2 submit stream, 3 results stream, 4 dead-letter stream, 5 this minute's counters
-- ARGV: 1 group, 2 entry id, 3 results maxlen, 4 dead maxlen, 5 ledger ttl secs, 6 delivery guard (0: none),
--       7 n result pairs, then result field/value pairs, then n ledger pairs, ledger pairs, then n dead pairs,
--       dead pairs, then n counter pairs, counter field/amount pairs
-- Returns rejected | duplicate | gone
local ledger, stream, results, dead = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local group, entry_id = ARGV[1], ARGV[2]
check_entry_id(entry_id)
uint(ARGV[3], 'results maxlen')
uint(ARGV[4], 'dead maxlen')
if uint(ARGV[5], 'ledger ttl') < 1 then refuse('ledger ttl must be at least 1 second') end
local guard = uint(ARGV[6], 'delivery guard')
local result_fields, i = take_pairs(7, 'result fields')
local ledger_fields
ledger_fields, i = take_pairs(i, 'ledger fields')
local dead_fields
dead_fields, i = take_pairs(i, 'dead-letter fields')
local counts
counts, i = take_pairs(i, 'counter fields')
if i - 1 ~= #ARGV then refuse('arguments left over after the counter fields') end
for k = 2, #counts, 2 do uint(counts[k], 'counter amount') end
if #result_fields == 0 or #ledger_fields == 0 then refuse('a rejection needs result and ledger fields') end
local ledger_exists = check_type(ledger, 'hash')
local stream_exists = check_type(stream, 'stream')
check_type(results, 'stream')
check_type(dead, 'stream')

if guard > 0 then
  if not stream_exists then return REJECT_GONE end
  local pending = redis.call('XPENDING', stream, group, entry_id, entry_id, 1)[1]
  if not pending or pending[4] <= guard then return REJECT_GONE end
end
if ledger_exists then
  check_counter(redis.call('HGET', ledger, F_DUPLICATES), 'the ledger\'s ' .. F_DUPLICATES)
end

local verdict = REJECT_REJECTED
if ledger_exists then
  verdict = REJECT_DUPLICATE
  redis.call('HINCRBY', ledger, F_DUPLICATES, 1)
else
  redis.call('XADD', results, 'MAXLEN', '~', ARGV[3], '*', unpack(result_fields))
  redis.call('HSET', ledger, unpack(ledger_fields))
  redis.call('EXPIRE', ledger, ARGV[5])
  count_finished(KEYS[5], counts)
end
if #dead_fields > 0 then
  redis.call('XADD', dead, 'MAXLEN', '~', ARGV[4], '*', unpack(dead_fields))
end
redis.call('XACK', stream, group, entry_id)
redis.call('XDEL', stream, entry_id)
return verdict
