-- Follows common.lua and limits.lua: leases n tokens of a token bucket
-- (see reserve.lua) to one process, which hands them out itself, without a
-- call each, anywhere in the lease's span of time.
--
-- The tokens are booked as arriving no sooner than span from now: the
-- bucket's schedule TAT moves from T = max(TAT, now + span) to
-- F = T + n*a. A token booked by the schedule at time v may go from
-- v - b*a (when the bucket allows it) to v - a (after that, the bucket has
-- refilled behind it); the lease's tokens, booked from T + a to F, may all
-- go from F - b*a to T, its span. So however the process hands them out
-- within it, the fleet's grants stay within b + r*t: a leased token is a
-- granted token. Tokens the process does not hand out lapse, spent.
--
-- A key held, whose rate a refusal cut, whose bucket the upstream's counters
-- steer, or whose limits differ across the fleet gets no lease: its
-- requests book one by one (reserve.lua), as every loop expects.
--
-- KEYS[1]  the bucket
-- KEYS[2]  the key's hold
-- KEYS[3]  the key's rate after refusals
-- KEYS[4]  the limits the fleet paces the key at (see limits.lua)
-- KEYS[5]  there while the fleet paces the key at different limits
-- ARGV[1]  interval: microseconds one token adds to the schedule
-- ARGV[2]  burst: how many tokens the bucket holds
-- ARGV[3]  n: how many tokens the process wants, at most b/2
-- ARGV[4]  span: how long from now the lease lasts at least, in
--          microseconds; with n, under b*a, so that a lease of a bucket
--          with room begins now
-- ARGV[5]  budget: the latest the lease may begin, microseconds from now
-- ARGV[6]  1 when the call announces the limit (see limits.lua), else 0
-- ARGV[7]  interval and burst as the limits' record writes them, "A B "
--
-- Returns {n, begin, end, now}: the tokens leased (0 for none, when the key
-- gets none or the lease would begin beyond the budget), the span of the
-- lease in microseconds from now, and the TIME the call used.
if redis.call('EXISTS', KEYS[2], KEYS[3], KEYS[5]) > 0 then
  return {0, 0, 0, now}
end
local a, b, n = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
if ARGV[6] == '1' then
  local other
  a, b, other = agree(4, a, b, ARGV[7])
  if displaced then drop_queue(1, 4) end
  if other ~= 0 then return {0, 0, 0, now} end
end
local stored, steer = read_bucket(1)
if steer then return {0, 0, 0, now} end
local from = math.max(stored or 0, now + tonumber(ARGV[4]))
local finish = from + n * a
local begin = math.max(finish - b * a, now)
if begin - now > tonumber(ARGV[5]) then
  return {0, begin - now, 0, now}
end
book_bucket(1, stored, nil, a, finish, n, 0, begin)
return {n, begin - now, from - now, now}
