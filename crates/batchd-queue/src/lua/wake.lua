-- A batch event asks for a chunk to be polled now. Only a chunk that is `polling` is woken (a chunk being
-- submitted must never be made due early: that could submit it twice), only when it is due later than now, and
-- at most once per ARGV[4] ms (`poll.initial_interval_ms`): a wake records its time in the chunk's C_WOKEN_AT
-- field, and a wake within that gap of the last one is ignored, so forged or duplicated events cannot make a poll
-- storm.
-- KEYS: 1 job ledger, 2 schedule. ARGV: 1 member (job#chunk), 2 chunk index, 3 now (ms, Redis's clock),
-- 4 least gap between two wakes (ms).
-- Returns 1 when the chunk was made due now, 0 otherwise. Everything is checked before the first write.
local now = uint(ARGV[3], 'now')
local gap = uint(ARGV[4], 'wake gap')
uint(ARGV[2], 'chunk index')
local woken_field = chunk_field(ARGV[2], C_WOKEN_AT)
local chunk = read_hash(KEYS[1], chunk_field(ARGV[2], C_STATE), woken_field)
if chunk[1] ~= CHUNK_POLLING then
  return 0
end
local last = tonumber(chunk[2] or '')
if last and now < last + gap then
  return 0
end
local score = typed('zset', 'ZSCORE', KEYS[2], ARGV[1])
if not score or tonumber(score) <= now then
  return 0
end
redis.call('HSET', KEYS[1], woken_field, ARGV[3])
redis.call('ZADD', KEYS[2], 'XX', ARGV[3], ARGV[1])
return 1
