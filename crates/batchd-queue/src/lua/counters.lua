-- Shared by the storage scripts that end a job (publish, reject), after prelude.lua; not part of the Functions
-- library (functions.lua), whose callers never count.

-- Adds a finished job's counts (field/amount pairs) to the minute's counter hash, after the script's other
-- writes (roll_up.lua adds each minute to its hour once the minute is over, so a job costs one command per count,
-- not two); the hash gets its time to live when one of its fields is new (a new hash has only new fields), not on
-- every job. A counter key of another type or a field that is not an integer is skipped: the result is out
-- already and the counters only feed the dashboard's rates. Returns false when one was skipped.
local function count_finished(minute, counts)
  local counted, fresh = true, false
  for k = 1, #counts, 2 do
    local reply = redis.pcall('HINCRBY', minute, counts[k], counts[k + 1])
    if type(reply) == 'table' and reply['err'] then
      counted = false
    elseif reply == tonumber(counts[k + 1]) then
      fresh = true
    end
  end
  if fresh then redis.call('EXPIRE', minute, STATS_MINUTE_TTL) end
  return counted
end
