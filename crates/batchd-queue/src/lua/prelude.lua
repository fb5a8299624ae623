-- Shared by every script (prepended when the script is built, after the names, words and limits that are
-- generated from Rust by `script_constants` in store.rs: F_<field> and C_<chunk field> for every ledger field,
-- JOB_<state> and CHUNK_<state>, the verdicts and argument words, ENTRY_JOB_FIELD, MAX_CHUNKS, MAX_PAIRS,
-- MAX_LIMIT, and is_terminal, is_finished, chunk_field and member). A script never writes a ledger field name,
-- a state or the member format itself; a test fails on one.
--
-- Scripts check, then write: Redis keeps the writes a script made before an error, so everything that can fail
-- (key types, argument formats, counts, the ledger's own numbers) is checked with the helpers below before a
-- script's first write, and no `unpack` sees more than ~1,000 values.
--
-- Key types are paid for without a TYPE per key per call: a key the script reads anyway is read with `typed`
-- (the read itself refuses a key of another type, and reads come before writes), and of the keys it only writes,
-- the first write goes through `typed` too (a refused first write has written nothing). A key that is neither read
-- nor written first still gets a `check_type` (one command), so every key a script writes is known to be of the
-- right type before anything is written.

-- Ends the script with an error reply. Only ever called before the script's first write.
local function refuse(message)
  error({err = 'ERR batchd: ' .. message})
end

-- Refuses unless `key` is absent or holds a `want` (hash, stream, zset, string); returns whether it exists.
local function check_type(key, want)
  local found = redis.call('TYPE', key)['ok']
  if found ~= 'none' and found ~= want then
    refuse(key .. ' holds a ' .. found .. ', not a ' .. want)
  end
  return found ~= 'none'
end

-- redis.call(command, key, ...) for a read, or for the script's first write, on a key that must be absent or a
-- `want`: a key of another type is refused (its type read only on this error path) before anything is written.
local function typed(want, command, key, ...)
  local reply = redis.pcall(command, key, ...)
  if type(reply) == 'table' and reply['err'] then
    check_type(key, want)
    refuse(key .. ': ' .. reply['err'])
  end
  return reply
end

-- HMGET of a hash the script reads before it writes (see `typed`).
local function read_hash(key, ...)
  return typed('hash', 'HMGET', key, ...)
end

-- `value` as a number, refused unless it is a non-negative integer of at most 15 digits (exact in Lua).
local function uint(value, what)
  if type(value) ~= 'string' or #value > 15 or not string.match(value, '^%d+$') then
    refuse(what .. ' must be a non-negative integer, got ' .. string.sub(tostring(value), 1, 64))
  end
  return tonumber(value)
end

-- Refuses unless `value` (a hash field about to be HINCRBY'd) is absent or an integer HINCRBY accepts.
local function check_counter(value, what)
  if value and (#value > 18 or not string.match(value, '^%-?%d+$')) then
    refuse(what .. ' is not an integer')
  end
end

-- Refuses unless `id` is a full stream entry id (`<ms>-<seq>`), which XACK and XDEL require.
local function check_entry_id(id)
  if type(id) ~= 'string' or #id > 41 or not string.match(id, '^%d+%-%d+$') then
    refuse('entry id must be <ms>-<seq>, got ' .. string.sub(tostring(id), 1, 64))
  end
end

-- Refuses unless `items` is a chunk's "start:len".
local function check_items(items)
  if type(items) ~= 'string' or #items > 31 or not string.match(items, '^%d+:%d+$') then
    refuse('chunk items must be start:len, got ' .. string.sub(tostring(items), 1, 64))
  end
end

-- Reads a count from ARGV[count_at] and that many field/value pairs after it; refuses a count over MAX_PAIRS or
-- past the end of ARGV. Returns the list and the index after it.
local function take_pairs(count_at, what)
  local n = uint(ARGV[count_at], what .. ' count')
  if n > MAX_PAIRS then refuse(what .. ': ' .. n .. ' pairs, at most ' .. MAX_PAIRS) end
  if count_at + 2 * n > #ARGV then refuse(what .. ': fewer arguments than ' .. n .. ' pairs') end
  local out = {}
  for k = 1, 2 * n do out[k] = ARGV[count_at + k] end
  return out, count_at + 2 * n + 1
end

-- redis.call(command, key, ...head, ...list), with `list` sent in slices of 1,000 values: one call for any
-- ordinary job, and never more values than Lua's unpack can take. Slices are even, so pairs stay whole. With
-- `want`, the first slice is the script's first write and goes through `typed`.
local function call_sliced(command, key, head, list, want)
  for first = 1, math.max(#list, 1), 1000 do
    local args = {}
    for _, value in ipairs(head) do args[#args + 1] = value end
    for k = first, math.min(first + 999, #list) do args[#args + 1] = list[k] end
    if #args > #head then
      if want and first == 1 then typed(want, command, key, unpack(args)) else redis.call(command, key, unpack(args)) end
    end
  end
end
