-- Books a request on one of a pool's keys (the credentials of one
-- upstream, each a key of its own): the one whose wait would end soonest,
-- in one call. It follows a booking script (reserve.lua or quota.lua, with
-- its prelude) wrapped as decide(KEYS, ARGV), which it asks of each key in
-- turn: first with a budget no caller accepts, which books nothing and
-- says how long the wait would be, then, of the key chosen, with the
-- caller's budget.
--
-- KEYS     the booking's keys of each candidate in turn, as decide takes
--          them: the same number for each
-- ARGV[1]  n, the number of candidates
-- ARGV[2]  the candidate asked first (from 1): a session's own, or the
--          next in turn. The first that can go at once is taken; else the
--          soonest, the earlier asked on a tie
-- ARGV[3]  the position of the budget among the booking's arguments
-- ARGV[4]  the position in the booking's reply of its recovered flag
-- ARGV[5], ...  the booking's arguments
--
-- Returns the chosen candidate's booking reply (see the booking script; as
-- short as it is), then its number. A candidate whose record holds this
-- call's booking (a call asked again: see record.lua) is the one chosen, as
-- before.
local n, first, at, rec = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local m = #KEYS / n
local args = {unpack(ARGV, 5)}
local budget = args[at]

-- decide_on runs decide for candidate c with args; a key's foreign data
-- is named by its place among all of KEYS.
local function decide_on(c)
  local ok, reply = pcall(decide, {unpack(KEYS, (c - 1) * m + 1, c * m)}, args)
  if ok then return reply end
  local text = type(reply) == 'table' and reply.err or tostring(reply)
  local i, problem = string.match(text, '^PACEKEY (%d+) (.*)$')
  if i then
    error({err = 'PACEKEY ' .. ((c - 1) * m + tonumber(i)) .. ' ' .. problem})
  end
  error(reply)
end

args[at] = '-1'
local best, soonest, recovered = nil, nil, 0
for j = 0, n - 1 do
  local c = (first - 1 + j) % n + 1
  local reply = decide_on(c)
  if reply[1] == 1 then -- booked by this call before: its record
    reply[#reply + 1] = c
    return reply
  end
  if not soonest or reply[2] < soonest then
    best, soonest, recovered = c, reply[2], reply[rec]
  end
  if soonest == 0 then break end
end

args[at] = budget
local reply = decide_on(best)
if recovered == 1 then -- the probe dropped its rate
  if #reply < rec then -- reserve.lua's, its last five left off (see
    -- booking_reply in record.lua): its whole length is rec + 2
    for i = #reply + 1, rec + 2 do reply[i] = 0 end
  end
  reply[rec] = 1
end
reply[#reply + 1] = best
return reply
