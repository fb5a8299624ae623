-- Shared rate limiter (GCRA), one bucket per key, used by every replica. Time is Redis's own clock, so replicas
-- with skewed clocks still share one schedule. Returns 0 when the caller may go now (and books its slot), else the
-- number of milliseconds to wait before asking again. A bucket value that is not a number (written by someone
-- else) counts as an empty bucket and is replaced; a key of another type is refused. Checked before the write.
-- KEYS: 1 bucket   ARGV: 1 emission interval ms (window / limit, may be fractional), 2 burst (>= 1)
local interval = tonumber(ARGV[1])
if not interval or interval ~= interval or interval <= 0 or interval >= 1e15 then
  refuse('emission interval must be a positive number of milliseconds')
end
local burst = uint(ARGV[2], 'burst')
if burst < 1 then refuse('burst must be at least 1') end
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local tat = tonumber(typed('string', 'GET', KEYS[1]) or '0') or 0
if tat ~= tat or tat < now then tat = now end
local tolerance = interval * (burst - 1)
if tat - now > tolerance then
  return math.ceil(tat - now - tolerance)
end
local new_tat = tat + interval
redis.call('SET', KEYS[1], tostring(new_tat), 'PX', math.ceil(new_tat - now + interval) + 1000)
return 0
