-- Claims due schedule members the caller read (a ZRANGEBYSCORE it ran just before): each one still due is
-- re-scored to now + lease, so a replica that dies while working on it lets it become due again, and its chunk's
-- claim counter (the fencing token, C_CLAIM) is incremented, so a replica that held an earlier claim of the same
-- chunk can no longer write it. A candidate another replica claimed in between (no longer due) is skipped. The
-- claim reads each chunk's view (VIEW_FIELDS, generated from Rust) and cancel flag in the same step, so the step
-- that follows starts without reading the ledger again. The cost depends on the number of candidates (at most
-- MAX_LIMIT), never on the backlog. Every read (a ledger of another type is refused by read_hash, a schedule of
-- another type by its ZMSCORE, a cancel flag of another type by its GET) and check comes before the first write.
-- KEYS: 1 schedule, then per candidate: its ledger, its cancel flag
-- ARGV: 1 now ms, 2 lease-until ms, then per candidate: member, chunk index
-- Returns, for each candidate claimed: member, token, and when the token is not 0 the view's values (with the new
-- token) and the cancel flag. Token 0: its job has no ledger or has finished (the step then takes the member off
-- the schedule).
local schedule = KEYS[1]
local now = uint(ARGV[1], 'now')
local lease_until = uint(ARGV[2], 'lease end')
local pairs = #KEYS - 1
if pairs < 2 or pairs > 2 * MAX_LIMIT then refuse('candidates must be 1 to ' .. MAX_LIMIT) end
if pairs % 2 ~= 0 or #ARGV ~= 2 + pairs then
  refuse('each candidate needs a ledger key, a cancel flag key, a member and a chunk index')
end
local n = pairs / 2
local members, indices = {}, {}
for k = 1, n do
  members[k] = ARGV[1 + 2 * k]
  indices[k] = uint(ARGV[2 + 2 * k], 'chunk index')
end
local scores = {}
for first = 1, n, 1000 do
  local slice = {}
  for k = first, math.min(first + 999, n) do slice[#slice + 1] = members[k] end
  for _, score in ipairs(typed('zset', 'ZMSCORE', schedule, unpack(slice))) do scores[#scores + 1] = score end
end
local claimed, tokens, views, leased = {}, {}, {}, {}
for k = 1, n do
  local score = scores[k] and tonumber(scores[k])
  if score and score <= now then
    local names = {}
    for j, field in ipairs(VIEW_FIELDS) do
      if field[1] then names[j] = chunk_field(indices[k], field[2]) else names[j] = field[2] end
    end
    local view = read_hash(KEYS[2 * k], unpack(names))
    local token = 0
    if view[1] and not is_terminal(view[1]) then
      token = uint(view[VIEW_CLAIM] or '0', 'the chunk\'s ' .. C_CLAIM) + 1
      view[VIEW_CLAIM] = tostring(token)
      view[#view + 1] = typed('string', 'GET', KEYS[2 * k + 1])
    end
    claimed[#claimed + 1] = k
    tokens[#tokens + 1] = token
    views[#views + 1] = view
    leased[#leased + 1] = lease_until
    leased[#leased + 1] = members[k]
  end
end

local out = {}
for j, k in ipairs(claimed) do
  out[#out + 1] = members[k]
  out[#out + 1] = tokens[j]
  if tokens[j] > 0 then
    redis.call('HSET', KEYS[2 * k], chunk_field(indices[k], C_CLAIM), tokens[j])
    for _, value in ipairs(views[j]) do out[#out + 1] = value end
  end
end
call_sliced('ZADD', schedule, {'XX'}, leased)
return out
