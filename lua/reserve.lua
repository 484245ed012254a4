-- Books cost tokens of a token bucket kept as a GCRA schedule, or, when the
-- wait would exceed the caller's budget, reports it and books nothing.
--
-- This is quota.lua for a quota of one bucket, the common case, in fewer
-- steps: keep the two in step (the property tests hold both to one model).
--
-- KEYS[1]  the bucket: its theoretical arrival time (TAT), integer
--          microseconds of Redis's clock; the bucket is full when TAT <= now
-- ARGV[1]  interval: microseconds one token adds to the schedule
-- ARGV[2]  burst: how many tokens the bucket holds
-- ARGV[3]  cost: how many tokens the caller wants
-- ARGV[4]  budget: the longest wait the caller accepts, in microseconds
-- ARGV[5]  not before: the caller cannot go sooner than this many
--          microseconds from now; the bucket books it as arriving then
--
-- Returns {granted (1 or 0), delay, now, finish, booked}: the wait in
-- microseconds, the TIME the decision used, the TAT the booking leaves (or
-- would have left), and, for a bucket the upstream's counters steer, its
-- count of units booked after the booking (else 0). All are whole numbers,
-- which Redis replies exactly.
local interval = tonumber(ARGV[1])
local arrival = now + tonumber(ARGV[5])
local stored, steer = read_bucket(1)
if steer then -- the upstream's counters steer it: the general way
  local burst, cost = tonumber(ARGV[2]), tonumber(ARGV[3])
  local slot = math.max(arrival, bucket_allow(stored, steer, interval, burst, cost, arrival))
  local finish = bucket_finish(stored, steer, interval, burst, cost, slot)
  if slot - now > tonumber(ARGV[4]) then
    return {0, slot - now, now, finish, 0}
  end
  local booked = count_booked(steer, cost)
  write_bucket(KEYS[1], finish, steer)
  return {1, slot - now, now, finish, booked}
end

local tat = arrival
if stored and stored > arrival then tat = stored end

local finish = tat + ARGV[3] * interval
local delay = finish - ARGV[2] * interval - now
if delay < arrival - now then delay = arrival - now end
if delay > tonumber(ARGV[4]) then
  return {0, delay, now, finish, 0}
end

-- While the TAT stays within one second the expiry stands, and KEEPTTL
-- spares Redis the cost of setting it anew on every booking.
local second = finish - finish % 1000000
if stored and stored - stored % 1000000 == second then
  redis.call('SET', KEYS[1], string.format('%d', finish), 'KEEPTTL')
else
  redis.call('SET', KEYS[1], string.format('%d', finish), 'PXAT', full_expiry(finish))
end
return {1, delay, now, finish, 0}
