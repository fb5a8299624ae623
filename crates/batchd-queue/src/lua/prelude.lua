-- Shared by every script (prepended when the script is built).
local function is_terminal(state)
  return state == 'completed' or state == 'failed' or state == 'expired' or state == 'cancelled'
end
