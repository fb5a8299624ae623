-- Shared by the storage scripts that end a job (publish, reject), after prelude.lua; not part of the Functions
-- library (functions.lua), whose callers never count.

-- Adds a finished job's counts (field/amount pairs) to the minute's and the hour's counter hashes, after the
-- script's other writes; a hash gets its time to live when one of its fields is new (a new hash has only new
-- fields), not on every job. A counter key of another type or a field that is not an integer is skipped: the
-- result is out already and the counters only feed the dashboard's rates. Returns false when one was skipped.
local function count_finished(minute, hour, counts)
  local counted = true
  for _, target in ipairs({{minute, STATS_MINUTE_TTL}, {hour, STATS_HOUR_TTL}}) do
    local fresh = false
    for k = 1, #counts, 2 do
      local reply = redis.pcall('HINCRBY', target[1], counts[k], counts[k + 1])
      if type(reply) == 'table' and reply['err'] then
        counted = false
      elseif reply == tonumber(counts[k + 1]) then
        fresh = true
      end
    end
    if fresh then redis.call('EXPIRE', target[1], target[2]) end
  end
  return counted
end
