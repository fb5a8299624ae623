-- Accepts one ingress entry as a new job, in one atomic step: create the ledger (each chunk with its own request
-- items), schedule every chunk, and acknowledge + delete the entry. A job id that already has a ledger is a
-- duplicate: the entry is acknowledged and deleted, the ledger counts it, and nothing else happens.
-- The chunks' items are copied here from the entry itself when the caller gives their byte spans ("entry"), so
-- a big job does not travel back to Redis; "inline" carries them in the arguments instead.
-- The first chunk can be marked `submitting` (attempt 1) for a caller that posts it right away, unless the job's
-- cancellation was requested before it arrived: then it stays `pending` and is due at once, for the schedule to
-- conclude it.
-- A one-chunk job can instead be queued for packing (first chunk's state PACK_QUEUED): its chunk stays `pending`
-- with C_PACK = PACK_QUEUED, scheduled only at the "other chunks" due time (the caller passes the job's deadline),
-- and joins its packing queue (KEYS[5]), scored by when it must go: its arrival plus its wait (ARGV[11], the
-- packing window, shorter for a job whose deadline is near), so the queue is in arrival order for jobs with the
-- same wait. The packing key's next pack (KEYS[6]) is due when the queue's first chunk must go, sooner when
-- arrivals pause or the queue holds a full pack's members.
-- KEYS: 1 ledger, 2 submit stream, 3 schedule, 4 cancel flag[, 5 packing queue, 6 packers]
-- ARGV: 1 group, 2 entry id, 3 job id, 4 n_chunks, 5 first-chunk due ms, 6 other-chunks due ms,
--       7 first chunk's state (submitting | pending | PACK_QUEUED), 8 items source (entry | inline),
--       [with PACK_QUEUED: 9 packing key, 10 now ms, 11 wait ms, 12 pause ms, 13 members of a full pack,]
--       then ledger field/value pairs, the marker
--       "--chunks", then per chunk: items "start:len" and either the byte span "from:to" of its items in the
--       `job` field (entry) or its requests JSON (inline)
-- Returns {verdict, state}; verdict: accepted | cancelled | duplicate | missing (the entry is gone or not what
-- the caller read, with "entry": nothing was done, the caller retries "inline")
-- Everything is checked before the first write (key types, every argument, at most MAX_CHUNKS chunks), so an
-- error reply means nothing was written: the ledger is read, the entry is read from the stream (an "inline" call
-- checks the stream's type instead), and the schedule is written first. The ledger starts its count of unfinished
-- chunks (F_OPEN_CHUNKS).
local ledger, stream, schedule = KEYS[1], KEYS[2], KEYS[3]
local group, entry_id, job_id = ARGV[1], ARGV[2], ARGV[3]
check_entry_id(entry_id)
local n_chunks = uint(ARGV[4], F_N_CHUNKS)
if n_chunks < 1 or n_chunks > MAX_CHUNKS then
  refuse('a job has 1 to ' .. MAX_CHUNKS .. ' chunks, got ' .. n_chunks)
end
local first_due, other_due = ARGV[5], ARGV[6]
uint(first_due, 'first-chunk due time')
uint(other_due, 'other-chunks due time')
local first_state, source = ARGV[7], ARGV[8]
if first_state ~= CHUNK_SUBMITTING and first_state ~= CHUNK_PENDING and first_state ~= PACK_QUEUED then
  refuse('first chunk state must be ' .. CHUNK_SUBMITTING .. ', ' .. CHUNK_PENDING .. ' or ' .. PACK_QUEUED)
end
local i = 9
local pack
if first_state == PACK_QUEUED then
  if n_chunks ~= 1 or #KEYS ~= 6 then refuse('only a one-chunk job is queued for packing, with its two keys') end
  pack = {key = ARGV[9], now = uint(ARGV[10], 'now'), window = uint(ARGV[11], 'packing wait'),
    pause = uint(ARGV[12], 'packing pause'), full = uint(ARGV[13], 'members of a full pack')}
  i = 14
end
if source ~= SOURCE_ENTRY and source ~= SOURCE_INLINE then
  refuse('items source must be ' .. SOURCE_ENTRY .. ' or ' .. SOURCE_INLINE)
end
-- A ledger always has a state; a job id whose ledger has one is a duplicate.
local head = read_hash(ledger, F_STATE, F_DUPLICATES)
if head[1] then
  check_counter(head[2], 'the ledger\'s ' .. F_DUPLICATES)
  typed('stream', 'XACK', stream, group, entry_id)
  redis.call('XDEL', stream, entry_id)
  redis.call('HINCRBY', ledger, F_DUPLICATES, 1)
  return {ACCEPT_DUPLICATE, head[1]}
end

local fields = {}
while ARGV[i] ~= CHUNKS_MARKER do
  if i + 1 > #ARGV then refuse('the ledger pairs must be followed by the ' .. CHUNKS_MARKER .. ' marker') end
  fields[#fields + 1] = ARGV[i]
  fields[#fields + 1] = ARGV[i + 1]
  i = i + 2
end
if #ARGV ~= i + 2 * n_chunks then
  refuse('expected ' .. n_chunks .. ' chunk argument pairs after ' .. CHUNKS_MARKER)
end
fields[#fields + 1] = F_OPEN_CHUNKS
fields[#fields + 1] = n_chunks

local body
if source == SOURCE_ENTRY then
  local entry = typed('stream', 'XRANGE', stream, entry_id, entry_id)[1]
  if entry then
    local values = entry[2]
    for k = 1, #values, 2 do
      if values[k] == ENTRY_JOB_FIELD then
        body = values[k + 1]
        break
      end
    end
  end
  if not body then return {ACCEPT_MISSING, ''} end
else
  check_type(stream, 'stream')
end

local verdict = ACCEPT_ACCEPTED
if first_state ~= CHUNK_PENDING and redis.call('EXISTS', KEYS[4]) == 1 then
  -- Due at once, for the schedule to conclude it (a packed job's "other chunks" time is its deadline).
  if pack then other_due = tostring(pack.now) end
  verdict, first_state, first_due, pack = ACCEPT_CANCELLED, CHUNK_PENDING, other_due, nil
end
-- When the packing queue's first chunk must go, its size, and the packers' type, are read before the first write.
local must_go, queued
if pack then
  local first = typed('zset', 'ZRANGE', KEYS[5], 0, 0, 'WITHSCORES')
  must_go = first[2] and tonumber(first[2]) or (pack.now + pack.window)
  queued = redis.call('ZCARD', KEYS[5])
  typed('zset', 'ZSCORE', KEYS[6], pack.key)
end

local members = {}
for chunk = 0, n_chunks - 1 do
  local items, source_arg = ARGV[i + 1 + 2 * chunk], ARGV[i + 2 + 2 * chunk]
  check_items(items)
  local requests = source_arg
  if body then
    local from, to = string.match(source_arg, '^(%d+):(%d+)$')
    -- A run of items starts with the first one's '{' and ends with the last one's '}'; anything else means
    -- the entry is not the text the caller decoded.
    if not from or #from > 15 or #to > 15 then return {ACCEPT_MISSING, ''} end
    local run = string.sub(body, tonumber(from) + 1, tonumber(to))
    if string.sub(run, 1, 1) ~= '{' or string.sub(run, -1) ~= '}' then return {ACCEPT_MISSING, ''} end
    requests = '[' .. run .. ']'
  elseif string.sub(requests, 1, 1) ~= '[' then
    refuse('chunk ' .. chunk .. ': requests must be a JSON array')
  end
  local state, attempts, due = CHUNK_PENDING, 0, other_due
  if chunk == 0 and not pack then
    state, due = first_state, first_due
    if state == CHUNK_SUBMITTING then attempts = 1 end
  end
  local chunk_fields = {chunk_field(chunk, C_STATE), state, chunk_field(chunk, C_ITEMS), items,
    chunk_field(chunk, C_REQUESTS), requests, chunk_field(chunk, C_ATTEMPTS), attempts,
    chunk_field(chunk, C_N_POLLS), 0, chunk_field(chunk, C_POLL_FAILURES), 0}
  -- The first chunk posted at once is claimed by the take-in (its first claim, under its lease).
  if state == CHUNK_SUBMITTING then
    chunk_fields[#chunk_fields + 1] = chunk_field(chunk, C_CLAIM)
    chunk_fields[#chunk_fields + 1] = FIRST_CLAIM
  end
  if pack then
    chunk_fields[#chunk_fields + 1] = chunk_field(chunk, C_PACK)
    chunk_fields[#chunk_fields + 1] = PACK_QUEUED
  end
  for _, value in ipairs(chunk_fields) do fields[#fields + 1] = value end
  members[#members + 1] = due
  members[#members + 1] = member(job_id, chunk)
end
call_sliced('ZADD', schedule, {}, members, 'zset')
call_sliced('HSET', ledger, {}, fields)
if pack then
  local by = pack.now + pack.window
  redis.call('ZADD', KEYS[5], by, member(job_id, 0))
  local due = math.min(must_go, by, pack.now + pack.pause)
  if queued + 1 >= pack.full then due = pack.now end
  redis.call('ZADD', KEYS[6], due, pack.key)
end
redis.call('XACK', stream, group, entry_id)
redis.call('XDEL', stream, entry_id)
return {verdict, ''}
