-- Publishes a job's one result entry and closes its ledger, in one atomic step. The ledger state is the guard:
-- a job that already finished is never published again, so results are published exactly once per job.
-- The job is counted in the finished-jobs counters in the same step (see count_finished), so a replica that dies
-- after publishing cannot leave it uncounted.
-- Everything is checked before the first write (the ledger is read, the schedule's type checked, the result entry
-- is the first write); the result entry is at most MAX_PAIRS pairs.
-- The entry's size (the bytes of its field names and values) is recorded in the ledger beside its id, in the same
-- HSET, so a reader (the dashboard) knows how large the entry is before it decides to read it.
-- KEYS: 1 ledger, 2 results stream, 3 schedule, 4 cancel flag, 5 this minute's counters, 6 remote batches
-- ARGV: 1 final state, 2 now ms, 3 results maxlen, 4 ledger ttl secs, 5 job id, 6 error json (or ""),
--       7 n result pairs, then result field/value pairs, then n counter pairs, then counter field/amount pairs
-- Returns 1 (published), 2 (published; a counter could not be written) or 0 (the job had finished: nothing done)
local ledger, results, schedule = KEYS[1], KEYS[2], KEYS[3]
if not is_terminal(ARGV[1]) then
  refuse('final state must be ' .. JOB_COMPLETED .. ', ' .. JOB_FAILED .. ', ' .. JOB_EXPIRED .. ' or '
    .. JOB_CANCELLED)
end
uint(ARGV[2], 'now')
uint(ARGV[3], 'results maxlen')
if uint(ARGV[4], 'ledger ttl') < 1 then refuse('ledger ttl must be at least 1 second') end
if ARGV[6] == nil then refuse('missing error argument') end
local entry_fields, after = take_pairs(7, 'result fields')
local counts
counts, after = take_pairs(after, 'counter fields')
if after - 1 ~= #ARGV then refuse('arguments left over after the counter fields') end
if #entry_fields == 0 then refuse('a result entry needs fields') end
local entry_bytes = 0
for k = 1, #entry_fields do entry_bytes = entry_bytes + #entry_fields[k] end
for k = 2, #counts, 2 do uint(counts[k], 'counter amount') end
local head = read_hash(ledger, F_STATE, F_N_CHUNKS)
local state = head[1]
if not state or is_terminal(state) then return 0 end
local n_chunks = uint(head[2] or '0', 'the ledger\'s ' .. F_N_CHUNKS)
if n_chunks > MAX_CHUNKS then refuse('the ledger has ' .. n_chunks .. ' chunks, more than ' .. MAX_CHUNKS) end

check_type(schedule, 'zset')

local entry = typed('stream', 'XADD', results, 'MAXLEN', '~', ARGV[3], '*', unpack(entry_fields))
local fields = {F_STATE, ARGV[1], F_FINISHED_AT, ARGV[2], F_UPDATED_AT, ARGV[2], F_RESULT_ENTRY, entry,
  F_RESULT_BYTES, string.format('%d', entry_bytes)}
if ARGV[6] ~= '' then
  fields[#fields + 1] = F_ERROR
  fields[#fields + 1] = ARGV[6]
end
local dropped, members = {}, {}
for c = 0, n_chunks - 1 do
  dropped[#dropped + 1] = chunk_field(c, C_OUTPUT)
  dropped[#dropped + 1] = chunk_field(c, C_REFERENCES)
  -- A job that did not complete keeps its request items until the ledger expires, so `batchd retry` can run it
  -- again; a completed job's are dropped at once.
  if ARGV[1] == JOB_COMPLETED then dropped[#dropped + 1] = chunk_field(c, C_REQUESTS) end
  members[#members + 1] = member(ARGV[5], c)
  if ARGV[1] == JOB_COMPLETED then
    fields[#fields + 1] = chunk_field(c, C_STATE)
    fields[#fields + 1] = CHUNK_DONE
  end
end
call_sliced('HSET', ledger, {}, fields)
call_sliced('HDEL', ledger, {}, dropped)
call_sliced('ZREM', schedule, {}, members)
-- The job's chunks leave the remote-batches index (a gauge's, see transition.lua; never in the way of the result).
for first = 1, #members, 1000 do
  redis.pcall('ZREM', KEYS[6], unpack(members, first, math.min(first + 999, #members)))
end
redis.call('EXPIRE', ledger, ARGV[4])
-- A cancellation flag outlives its job only when it arrived after the job's last step; it expires on its own.
if ARGV[1] == JOB_CANCELLED then redis.call('DEL', KEYS[4]) end
if count_finished(KEYS[5], counts) then return 1 end
return 2
