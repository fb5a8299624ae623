-- Claims due schedule members the caller read (a ZRANGEBYSCORE it ran just before): each one still due is
-- re-scored to now + lease, so a replica that dies while working on it lets it become due again, and its chunk's
-- claim counter (the fencing token, C_CLAIM) is incremented, so a replica that held an earlier claim of the same
-- chunk can no longer write it. A candidate another replica claimed in between (no longer due) is skipped. The
-- cost depends on the number of candidates (at most MAX_LIMIT), never on the backlog. Every read (a ledger of
-- another type is refused by read_hash) and check comes before the first write.
-- KEYS: 1 schedule, then the ledger of each candidate   ARGV: 1 now ms, 2 lease-until ms, then per candidate:
--       member, chunk index
-- Returns {member, token, ...} for each candidate claimed; token 0 when its job has no ledger or has finished
-- (the step then takes the member off the schedule).
local schedule = KEYS[1]
local now = uint(ARGV[1], 'now')
local lease_until = uint(ARGV[2], 'lease end')
local n = #KEYS - 1
if n < 1 or n > MAX_LIMIT then refuse('candidates must be 1 to ' .. MAX_LIMIT) end
if #ARGV ~= 2 + 2 * n then refuse('each candidate needs a ledger key, a member and a chunk index') end
local members, indices = {}, {}
for k = 1, n do
  members[k] = ARGV[1 + 2 * k]
  indices[k] = uint(ARGV[2 + 2 * k], 'chunk index')
end
check_type(schedule, 'zset')
local scores = {}
for first = 1, n, 1000 do
  local slice = {}
  for k = first, math.min(first + 999, n) do slice[#slice + 1] = members[k] end
  for _, score in ipairs(redis.call('ZMSCORE', schedule, unpack(slice))) do scores[#scores + 1] = score end
end
local claimed, tokens, leased = {}, {}, {}
for k = 1, n do
  local score = scores[k] and tonumber(scores[k])
  if score and score <= now then
    local head = read_hash(KEYS[k + 1], F_STATE, chunk_field(indices[k], C_CLAIM))
    local token = 0
    if head[1] and not is_terminal(head[1]) then
      token = uint(head[2] or '0', 'the chunk\'s ' .. C_CLAIM) + 1
    end
    claimed[#claimed + 1] = k
    tokens[#tokens + 1] = token
    leased[#leased + 1] = lease_until
    leased[#leased + 1] = members[k]
  end
end

local out = {}
for j, k in ipairs(claimed) do
  if tokens[j] > 0 then redis.call('HSET', KEYS[k + 1], chunk_field(indices[k], C_CLAIM), tokens[j]) end
  out[#out + 1] = members[k]
  out[#out + 1] = tokens[j]
end
call_sliced('ZADD', schedule, {'XX'}, leased)
return out
