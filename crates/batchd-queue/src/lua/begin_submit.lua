-- Marks a chunk `submitting` just before its POST, counting the attempt. A chunk found already `submitting`
-- was being submitted by a replica that died inside the submit window: the remote batch may exist already,
-- so the resubmission is counted as a possible duplicate.
-- KEYS: 1 ledger   ARGV: 1 chunk index, 2 now ms, 3 count this attempt (1/0)
-- Returns {verdict, attempts, job json, previous state, chunk items "start:len"}; verdict: gone | skip | submit | resubmit
local ledger, chunk = KEYS[1], ARGV[1]
local prefix = 'c' .. chunk .. ':'
local state = redis.call('HGET', ledger, 'state')
if not state or state == 'completed' or state == 'failed' or state == 'expired' then
  return {'gone', 0, '', state or '', ''}
end
local chunk_state = redis.call('HGET', ledger, prefix .. 'state')
if chunk_state ~= 'pending' and chunk_state ~= 'submitting' then
  return {'skip', 0, '', chunk_state or '', ''}
end
local verdict = 'submit'
if chunk_state == 'submitting' then
  verdict = 'resubmit'
  redis.call('HINCRBY', ledger, 'possible_duplicate_submits', 1)
end
local attempts = tonumber(redis.call('HGET', ledger, prefix .. 'attempts') or '0')
if ARGV[3] == '1' then
  attempts = redis.call('HINCRBY', ledger, prefix .. 'attempts', 1)
end
redis.call('HSET', ledger, prefix .. 'state', 'submitting', 'updated_at', ARGV[2])
return {verdict, attempts, redis.call('HGET', ledger, 'job'), chunk_state,
  redis.call('HGET', ledger, prefix .. 'items')}
