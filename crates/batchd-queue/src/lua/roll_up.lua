-- Adds finished minutes' counters to their hours' (see count_finished in counters.lua), each minute once: a
-- cursor holds the last minute rolled up, and a call rolls up the minutes after it that ended at least a minute ago
-- by Redis's clock (a publish that read the clock just before a minute ended still counts in that minute), in
-- order, stopping at the first one not over yet. Any replica may call it; a call that finds the cursor moved since
-- its caller read it does nothing, so no minute is added twice. The first call only sets the cursor. Every read
-- comes before the first write, and every hour key's type is checked before it.
-- KEYS: 1 cursor, then per minute: its counters, its hour's counters
-- ARGV: 1 the cursor as the caller read it ("" when there is none), then per minute: its number (the cursor + 1,
--       + 2, ...)
-- Returns the number of minutes rolled up.
local cursor = KEYS[1]
local n = (#KEYS - 1) / 2
if n ~= math.floor(n) or #ARGV ~= n + 1 then refuse('each minute needs its counters, its hour\'s and its number') end
if n > MAX_ROLL_UP then refuse('at most ' .. MAX_ROLL_UP .. ' minutes at once') end
local found = typed('string', 'GET', cursor)
if (found or '') ~= ARGV[1] then return 0 end
local time = redis.call('TIME')
local current = math.floor(tonumber(time[1]) / 60)
if not found then
  redis.call('SET', cursor, current - 2, 'EX', STATS_HOUR_TTL)
  return 0
end
local last = uint(found, 'the roll-up cursor')
local minutes, sums = {}, {}
for k = 1, n do
  local minute = uint(ARGV[k + 1], 'minute')
  if minute ~= last + k then refuse('minutes must follow the cursor one by one') end
  if minute > current - 2 then break end
  local fields = typed('hash', 'HGETALL', KEYS[2 * k])
  if #fields > 2 * MAX_PAIRS then refuse(KEYS[2 * k] .. ' has more than ' .. MAX_PAIRS .. ' counters') end
  for j = 2, #fields, 2 do check_counter(fields[j], KEYS[2 * k] .. ' ' .. fields[j - 1]) end
  check_type(KEYS[2 * k + 1], 'hash')
  minutes[#minutes + 1] = minute
  sums[#sums + 1] = fields
end
for k, fields in ipairs(sums) do
  local hour = KEYS[2 * k + 1]
  for j = 1, #fields, 2 do redis.call('HINCRBY', hour, fields[j], fields[j + 1]) end
  if #fields > 0 then redis.call('EXPIRE', hour, STATS_HOUR_TTL) end
end
if #minutes > 0 then redis.call('SET', cursor, minutes[#minutes], 'EX', STATS_HOUR_TTL) end
return #minutes
