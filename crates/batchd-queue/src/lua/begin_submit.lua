-- Marks a chunk `submitting` just before its POST, counting the attempt. A chunk found already `submitting`
-- was being submitted by a replica that died inside the submit window (or whose POST had an unknown outcome):
-- the remote batch may exist already, so the resubmission is counted as a possible duplicate, unless its last
-- attempt sent nothing and only waits for a batch it found to end (C_LOOKED equal to C_ATTEMPTS).
-- A job whose cancellation was requested is not submitted, and neither is a chunk whose claim the caller no
-- longer holds (its fencing token, C_CLAIM, is not the caller's). Everything is checked before the first write.
-- KEYS: 1 ledger, 2 cancel flag   ARGV: 1 chunk index, 2 now ms, 3 claim token
-- Returns {verdict, attempts, previous state, items "start:len", indices JSON or "", requests JSON, model};
-- verdict: gone | stale | cancelled | skip | submit | resubmit | resume_look
local ledger = KEYS[1]
local chunk = uint(ARGV[1], 'chunk index')
uint(ARGV[2], 'now')
local token = uint(ARGV[3], 'claim token')
local values = read_hash(ledger, F_STATE, chunk_field(chunk, C_STATE), chunk_field(chunk, C_ATTEMPTS),
  chunk_field(chunk, C_ITEMS), chunk_field(chunk, C_INDICES), F_MODEL, chunk_field(chunk, C_REQUESTS),
  F_POSSIBLE_DUPLICATE_SUBMITS, chunk_field(chunk, C_CLAIM), chunk_field(chunk, C_LOOKED))
local state, chunk_state = values[1], values[2]
if state and uint(values[9] or '0', 'the chunk\'s ' .. C_CLAIM) ~= token then
  return {SUBMIT_STALE, 0, chunk_state or '', '', '', '', ''}
end
if not state or is_terminal(state) then
  return {SUBMIT_GONE, 0, state or '', '', '', '', ''}
end
if redis.call('EXISTS', KEYS[2]) == 1 then
  return {SUBMIT_CANCELLED, 0, state, '', '', '', ''}
end
if chunk_state ~= CHUNK_PENDING and chunk_state ~= CHUNK_SUBMITTING then
  return {SUBMIT_SKIP, 0, chunk_state or '', '', '', '', ''}
end
local attempts = uint(values[3] or '0', 'the chunk\'s ' .. C_ATTEMPTS) + 1
check_counter(values[8], 'the ledger\'s ' .. F_POSSIBLE_DUPLICATE_SUBMITS)

local verdict = SUBMIT_SUBMIT
if chunk_state == CHUNK_SUBMITTING then
  if values[10] == (values[3] or '0') then
    verdict = SUBMIT_RESUME_LOOK
  else
    verdict = SUBMIT_RESUBMIT
    redis.call('HINCRBY', ledger, F_POSSIBLE_DUPLICATE_SUBMITS, 1)
  end
end
redis.call('HSET', ledger, chunk_field(chunk, C_STATE), CHUNK_SUBMITTING, chunk_field(chunk, C_ATTEMPTS), attempts,
  F_UPDATED_AT, ARGV[2])
return {verdict, attempts, chunk_state, values[4] or '', values[5] or '', values[7] or '', values[6] or ''}
