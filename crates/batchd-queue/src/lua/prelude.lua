-- Shared by every script (prepended when the script is built).
local function is_terminal(state)
  return state == 'completed' or state == 'failed' or state == 'expired' or state == 'cancelled'
end

-- redis.call(command, key, ...head, ...list), with `list` sent in slices of 1,000 values: one call for any
-- ordinary job, and never more values than Lua's unpack can take. Slices are even, so pairs stay whole.
local function call_sliced(command, key, head, list)
  for first = 1, math.max(#list, 1), 1000 do
    local args = {}
    for _, value in ipairs(head) do args[#args + 1] = value end
    for k = first, math.min(first + 999, #list) do args[#args + 1] = list[k] end
    if #args > #head then redis.call(command, key, unpack(args)) end
  end
end
