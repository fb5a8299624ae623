-- Marks a chunk `submitting` just before its POST, counting the attempt. A chunk found already `submitting`
-- was being submitted by a replica that died inside the submit window (or whose POST had an unknown outcome):
-- the remote batch may exist already, so the resubmission is counted as a possible duplicate.
-- A job whose cancellation was requested is not submitted. Everything is checked before the first write.
-- KEYS: 1 ledger, 2 cancel flag   ARGV: 1 chunk index, 2 now ms
-- Returns {verdict, attempts, previous state, items "start:len", indices JSON or "", requests JSON, model};
-- verdict: gone | cancelled | skip | submit | resubmit
local ledger = KEYS[1]
local chunk = uint(ARGV[1], 'chunk index')
uint(ARGV[2], 'now')
check_type(ledger, 'hash')
local prefix = 'c' .. chunk .. ':'
local values = redis.call('HMGET', ledger, 'state', prefix .. 'state', prefix .. 'attempts', prefix .. 'items',
  prefix .. 'indices', 'model', prefix .. 'requests', 'possible_duplicate_submits')
local state, chunk_state = values[1], values[2]
if not state or is_terminal(state) then
  return {'gone', 0, state or '', '', '', '', ''}
end
if redis.call('EXISTS', KEYS[2]) == 1 then
  return {'cancelled', 0, state, '', '', '', ''}
end
if chunk_state ~= 'pending' and chunk_state ~= 'submitting' then
  return {'skip', 0, chunk_state or '', '', '', '', ''}
end
local attempts = uint(values[3] or '0', 'the chunk\'s attempts') + 1
check_counter(values[8], 'the ledger\'s possible_duplicate_submits')

local verdict = 'submit'
if chunk_state == 'submitting' then
  verdict = 'resubmit'
  redis.call('HINCRBY', ledger, 'possible_duplicate_submits', 1)
end
redis.call('HSET', ledger, prefix .. 'state', 'submitting', prefix .. 'attempts', attempts, 'updated_at', ARGV[2])
return {verdict, attempts, chunk_state, values[4] or '', values[5] or '', values[7] or '', values[6] or ''}
