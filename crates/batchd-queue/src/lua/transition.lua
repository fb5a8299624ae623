-- A named transition of a claimed chunk, in one atomic step: it records what the step found out and when the
-- chunk is next due, and it is applied only by the holder of the chunk's latest claim (the fencing token,
-- C_CLAIM, equals the caller's) and only from the chunk states the transition starts from. A stale writer (a
-- replica whose claim was taken over while it was paused) or a chunk in another state gets a verdict, and nothing
-- is written. On a job that has finished (or has no ledger) a transition of the latest claim (and `forget`, from
-- any claim) only takes the member off the schedule. Every read (read_hash refuses a key of another type) and
-- check comes before the first write, and the first write is the schedule's (`typed` refuses a schedule of
-- another type before anything is written), so no TYPE is paid per call.
-- The remote-batches index (KEYS[3], a ZSET scored by submit time that only feeds a gauge) gets the member when
-- a submit is recorded and loses it when the job is found finished; it is written with redis.pcall and never fails
-- or undoes a transition (a key of another type is the sampler's error to report, not the job's).
-- KEYS: 1 ledger, 2 schedule, 3 remote batches
-- ARGV: 1 transition, 2 member, 3 chunk index, 4 claim token, 5 due ms ("" for forget), 6 now ms, then:
--   mark_submitted      7 request id, 8 remote status, 9 remote record JSON or ""   (submitting -> polling, the
--                       job running)
--   record_remote       7 remote record JSON             (submitting: what a multi-request submit created so far;
--                                                         the lease is renewed to the due time)
--   mark_pending_poll   7 remote status                  (polling: one more poll answered, failures reset)
--   mark_poll_failed    7 consecutive failures, 8 error  (polling)
--   mark_submit_retry   7 next state (pending|submitting), 8 error, 9 attempts to record or "", 10 "1" when the
--                       attempt only looked and waits for a batch it found to end, else ""   (submitting; left
--                       submitting, the attempt is recorded as uncertain, and as looked when 10 says so)
--   mark_recreate       7 consecutive failures, 8 error  (polling -> submitting: the batch was refused for a quota
--                                                         after it was created; it is created again; uncertain too)
--   mark_unsent         -                                (submitting -> pending: a cancelled job's chunk whose
--                                                         earlier submit was looked up and created nothing)
--   note_cancel         -                                (any state: the job's cancel seen at `now`, recorded once;
--                                                         the lease re-scored, only if still scheduled)
--   forget_cancel       -                                (any state: the cancel was withdrawn, when it was seen is
--                                                         dropped; the lease re-scored, only if still scheduled)
--   reschedule          -                                (pending, submitting, polling: a throttled step)
--   renew, release      -                                (any state: the lease re-scored, only if still scheduled)
--   forget              -                                (applies only to a finished job)
-- An attempt recorded as uncertain (C_UNCERTAIN equal to C_ATTEMPTS while submitting) tells the `cancel` function
-- that no submit of the chunk is in flight. Every transition answers with when the job's cancel was first seen
-- (F_CANCEL_SEEN_AT, read in the same HMGET), so a step that ends a submit learns of a cancel without a command.
-- Returns {verdict, chunk state found, the chunk's claim token, cancel seen at or ""}; verdict: applied | gone |
-- stale | refused
local ledger, schedule, remote = KEYS[1], KEYS[2], KEYS[3]
local transition, chunk_member = ARGV[1], ARGV[2]
local any_state = {}
local allowed = {
  [T_MARK_SUBMITTED] = {[CHUNK_SUBMITTING] = true},
  [T_RECORD_REMOTE] = {[CHUNK_SUBMITTING] = true},
  [T_MARK_PENDING_POLL] = {[CHUNK_POLLING] = true},
  [T_MARK_POLL_FAILED] = {[CHUNK_POLLING] = true},
  [T_MARK_SUBMIT_RETRY] = {[CHUNK_SUBMITTING] = true},
  [T_MARK_RECREATE] = {[CHUNK_POLLING] = true},
  [T_MARK_UNSENT] = {[CHUNK_SUBMITTING] = true},
  [T_NOTE_CANCEL] = any_state,
  [T_FORGET_CANCEL] = any_state,
  [T_RESCHEDULE] = {[CHUNK_PENDING] = true, [CHUNK_SUBMITTING] = true, [CHUNK_POLLING] = true},
  [T_RENEW] = any_state,
  [T_RELEASE] = any_state,
  [T_FORGET] = {},
}
local extra = {[T_MARK_SUBMITTED] = 3, [T_RECORD_REMOTE] = 1, [T_MARK_PENDING_POLL] = 1, [T_MARK_POLL_FAILED] = 2, [T_MARK_SUBMIT_RETRY] = 4,
  [T_MARK_RECREATE] = 2}
if not allowed[transition] then refuse('unknown transition ' .. string.sub(tostring(transition), 1, 64)) end
if #ARGV ~= 6 + (extra[transition] or 0) then
  refuse(transition .. ' takes ' .. (6 + (extra[transition] or 0)) .. ' arguments, got ' .. #ARGV)
end
local chunk = uint(ARGV[3], 'chunk index')
local token = uint(ARGV[4], 'claim token')
local due = ARGV[5]
if transition ~= T_FORGET then uint(due, 'due time') end
local now = uint(ARGV[6], 'now')
if transition == T_MARK_POLL_FAILED or transition == T_MARK_RECREATE then uint(ARGV[7], 'failures') end
if transition == T_MARK_SUBMIT_RETRY then
  if ARGV[7] ~= CHUNK_PENDING and ARGV[7] ~= CHUNK_SUBMITTING then
    refuse('a submit is retried ' .. CHUNK_PENDING .. ' or ' .. CHUNK_SUBMITTING)
  end
  if ARGV[9] ~= '' then uint(ARGV[9], C_ATTEMPTS) end
  if ARGV[10] ~= '' and (ARGV[10] ~= '1' or ARGV[7] ~= CHUNK_SUBMITTING) then
    refuse('only a submit left ' .. CHUNK_SUBMITTING .. ' is recorded as looked')
  end
end
local values = read_hash(ledger, F_STATE, chunk_field(chunk, C_STATE), chunk_field(chunk, C_CLAIM),
  chunk_field(chunk, C_N_POLLS), chunk_field(chunk, C_ATTEMPTS), F_CANCEL_SEEN_AT)
local state, chunk_state = values[1], values[2]
local held = uint(values[3] or '0', 'the chunk\'s ' .. C_CLAIM)
local cancel_seen_at = values[6] or ''
if state and held ~= token and transition ~= T_FORGET then
  return {FENCE_STALE, chunk_state or '', held, cancel_seen_at}
end
if not state or is_terminal(state) then
  typed('zset', 'ZREM', schedule, chunk_member)
  redis.pcall('ZREM', remote, chunk_member)
  return {FENCE_GONE, chunk_state or '', held, cancel_seen_at}
end
if allowed[transition] ~= any_state and not allowed[transition][chunk_state or ''] then
  return {FENCE_REFUSED, chunk_state or '', held, cancel_seen_at}
end
local n_polls = 0
if transition == T_MARK_PENDING_POLL then n_polls = uint(values[4] or '0', 'the chunk\'s ' .. C_N_POLLS) end
-- The attempt a chunk left `submitting` without a submit in flight is recorded as uncertain.
local attempts = values[5] or '0'
if transition == T_MARK_SUBMIT_RETRY and ARGV[9] ~= '' then attempts = ARGV[9] end
if transition == T_MARK_SUBMIT_RETRY or transition == T_MARK_RECREATE then
  uint(attempts, 'the chunk\'s ' .. C_ATTEMPTS)
end

if transition == T_RENEW or transition == T_RELEASE or transition == T_RECORD_REMOTE
  or transition == T_NOTE_CANCEL or transition == T_FORGET_CANCEL then
  typed('zset', 'ZADD', schedule, 'XX', due, chunk_member)
else
  typed('zset', 'ZADD', schedule, due, chunk_member)
end
local function f(name) return chunk_field(chunk, name) end
if transition == T_MARK_SUBMITTED then
  local fields = {f(C_STATE), CHUNK_POLLING, f(C_REQUEST_ID), ARGV[7], f(C_SUBMITTED_AT), now,
    f(C_REMOTE_STATUS), ARGV[8], F_STATE, JOB_RUNNING, F_UPDATED_AT, now}
  if ARGV[9] ~= '' then
    fields[#fields + 1] = f(C_REMOTE)
    fields[#fields + 1] = ARGV[9]
  end
  redis.call('HSET', ledger, unpack(fields))
  redis.pcall('ZADD', remote, now, chunk_member)
elseif transition == T_RECORD_REMOTE then
  redis.call('HSET', ledger, f(C_REMOTE), ARGV[7])
elseif transition == T_MARK_PENDING_POLL then
  redis.call('HSET', ledger, f(C_N_POLLS), n_polls + 1, f(C_REMOTE_STATUS), ARGV[7], f(C_POLL_FAILURES), 0)
elseif transition == T_MARK_POLL_FAILED then
  redis.call('HSET', ledger, f(C_POLL_FAILURES), ARGV[7], f(C_LAST_ERROR), ARGV[8])
elseif transition == T_MARK_RECREATE then
  redis.call('HSET', ledger, f(C_STATE), CHUNK_SUBMITTING, f(C_POLL_FAILURES), ARGV[7], f(C_LAST_ERROR), ARGV[8],
    f(C_UNCERTAIN), attempts)
elseif transition == T_MARK_SUBMIT_RETRY then
  local fields = {f(C_STATE), ARGV[7], f(C_LAST_ERROR), ARGV[8]}
  if ARGV[9] ~= '' then
    fields[#fields + 1] = f(C_ATTEMPTS)
    fields[#fields + 1] = ARGV[9]
  end
  if ARGV[7] == CHUNK_SUBMITTING then
    fields[#fields + 1] = f(C_UNCERTAIN)
    fields[#fields + 1] = attempts
  end
  if ARGV[10] == '1' then
    fields[#fields + 1] = f(C_LOOKED)
    fields[#fields + 1] = attempts
  end
  redis.call('HSET', ledger, unpack(fields))
elseif transition == T_MARK_UNSENT then
  redis.call('HSET', ledger, f(C_STATE), CHUNK_PENDING)
elseif transition == T_NOTE_CANCEL and cancel_seen_at == '' then
  redis.call('HSET', ledger, F_CANCEL_SEEN_AT, ARGV[6])
  cancel_seen_at = ARGV[6]
elseif transition == T_FORGET_CANCEL and cancel_seen_at ~= '' then
  redis.call('HDEL', ledger, F_CANCEL_SEEN_AT)
  cancel_seen_at = ''
end
return {FENCE_APPLIED, chunk_state, held, cancel_seen_at}
