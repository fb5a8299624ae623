-- A batch event asks for a chunk to be polled now. Only a chunk that is `polling` is woken (a chunk being
-- submitted must never be made due early: that could submit it twice), and only when it is due later than now.
-- KEYS: 1 job ledger, 2 schedule. ARGV: 1 member (job#chunk), 2 chunk index, 3 now (ms, Redis's clock).
-- Returns 1 when the chunk was made due now, 0 otherwise. Everything is checked before the one write.
local now = uint(ARGV[3], 'now')
uint(ARGV[2], 'chunk index')
check_type(KEYS[1], 'hash')
check_type(KEYS[2], 'zset')
local state = redis.call('HGET', KEYS[1], chunk_field(ARGV[2], C_STATE))
if state ~= CHUNK_POLLING then
  return 0
end
local score = redis.call('ZSCORE', KEYS[2], ARGV[1])
if not score or tonumber(score) <= now then
  return 0
end
redis.call('ZADD', KEYS[2], 'XX', ARGV[3], ARGV[1])
return 1
