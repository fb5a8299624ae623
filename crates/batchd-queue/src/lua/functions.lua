-- The Redis Functions library operators and producers call by name (FCALL), so that no role but the daemon and the
-- administrator needs to run Lua of its own (SCRIPT LOAD/EVAL/EVALSHA). Loaded by the daemon at start and by the
-- administrator (docs/security.md); `functions.rs` prepends the library header, the names generated from Rust and
-- the shared prelude, and appends the registrations, so every function name comes from Rust.
--
-- Functions run their commands under the caller's ACL (Redis 7), so a role still needs the commands below on its
-- own keys. Everything is checked before the first write, as in every script.

-- Requests a job's cancellation: sets the cancel flag (also honoured for a job not taken in yet) and makes the
-- job's scheduled chunks due now, so a replica notices at once. A chunk whose submit is in flight (`submitting`,
-- its attempt not recorded as uncertain) keeps its lease: claiming it would fence out the submit, whose batch
-- would then run on unrecorded; the submit records its batch (then its poll cancels it) or fails, and the job
-- waits for it. Returns the job's state, or "" when unknown.
-- keys: 1 ledger, 2 cancel flag, 3 schedule   args: 1 job id, 2 flag ttl secs, 3 reason
local function cancel(keys, args)
  if #keys ~= 3 then refuse('cancel takes 3 keys') end
  local ledger, flag, schedule = keys[1], keys[2], keys[3]
  if type(args[1]) ~= 'string' or #args[1] == 0 then refuse('missing job id') end
  if uint(args[2], 'flag ttl') < 1 then refuse('flag ttl must be at least 1 second') end
  if type(args[3]) ~= 'string' then refuse('missing reason') end
  check_type(ledger, 'hash')
  check_type(flag, 'string')
  check_type(schedule, 'zset')
  local head = redis.call('HMGET', ledger, F_STATE, F_N_CHUNKS)
  local state = head[1] or ''
  if is_terminal(state) then return state end
  local n = uint(head[2] or '0', 'the ledger\'s ' .. F_N_CHUNKS)
  if n > MAX_CHUNKS then refuse('the ledger has ' .. n .. ' chunks, more than ' .. MAX_CHUNKS) end
  local members = {}
  for first = 0, n - 1, 300 do
    local last = math.min(first + 299, n - 1)
    local names = {}
    for c = first, last do
      names[#names + 1] = chunk_field(c, C_STATE)
      names[#names + 1] = chunk_field(c, C_ATTEMPTS)
      names[#names + 1] = chunk_field(c, C_UNCERTAIN)
    end
    local values = redis.call('HMGET', ledger, unpack(names))
    for c = first, last do
      local k = 3 * (c - first)
      local in_flight = values[k + 1] == CHUNK_SUBMITTING and values[k + 2] ~= values[k + 3]
      if not in_flight then
        members[#members + 1] = 0
        members[#members + 1] = member(args[1], c)
      end
    end
  end

  redis.call('SET', flag, args[3], 'EX', args[2])
  call_sliced('ZADD', schedule, {'XX'}, members)
  return state
end

-- Moves a dead letter back to the submit stream, atomically and once: deletes dead-letter entry args[1] and, only
-- if that deleted exactly one entry, enqueues args[2] as a job. Returns the new submit entry id, or false when the
-- entry was not there (already retried or purged): concurrent retries of one entry enqueue it once.
-- keys: 1 dead-letter stream, 2 submit stream   args: 1 dead-letter entry id, 2 the job's JSON
local function dead_retry(keys, args)
  if #keys ~= 2 then refuse('dead_retry takes 2 keys') end
  check_entry_id(args[1])
  if type(args[2]) ~= 'string' or #args[2] == 0 then refuse('missing job') end
  check_type(keys[1], 'stream')
  check_type(keys[2], 'stream')
  if redis.call('XDEL', keys[1], args[1]) ~= 1 then return false end
  return redis.call('XADD', keys[2], '*', ENTRY_JOB_FIELD, args[2])
end
