-- Books cost tokens of a token bucket kept as a GCRA schedule, or, when the
-- wait would exceed the caller's budget, reports it and books nothing.
--
-- This is quota.lua for a quota of one bucket, the common case, in fewer
-- steps, with the limits the fleet paces the key at (see limits.lua); the
-- two book a bucket by the same functions of common.lua, and the property
-- tests hold both to one model.
--
-- KEYS[1]  the bucket: its theoretical arrival time (TAT), integer
--          microseconds of Redis's clock; the bucket is full when TAT <= now
-- KEYS[2]  the key's hold (see hold.lua): no request goes before it ends
-- KEYS[3]  the key's rate after refusals (see rate.lua), which holds the
--          request too; dropped once the key is back at its configured rate,
--          a round after its cut
-- KEYS[4]  the limits the fleet paces the key at (see limits.lua): the
--          bucket's interval and burst are the strictest standing there
-- KEYS[5]  there while the fleet paces the key at different limits (see
--          limits.lua)
-- KEYS[6]  the record of the call (see record.lua)
-- ARGV[1]  interval: microseconds one token adds to the schedule
-- ARGV[2]  burst: how many tokens the bucket holds
-- ARGV[3]  cost: how many tokens the caller wants
-- ARGV[4]  budget: the longest wait the caller accepts, in microseconds
-- ARGV[5]  not before: the caller cannot go sooner than this many
--          microseconds from now; the bucket books it as arriving then
-- ARGV[6]  1 when cost is a reservation's estimate (see estimated in
--          common.lua), else 0
-- ARGV[7]  1 when the booking announces the limit (see limits.lua), else 0
-- ARGV[8]  1 when the request is booked anew, its booking displaced by a
--          hold or a retime (see rate_book), else 0
-- ARGV[5] to ARGV[8] may be left off the end, each 0 then: a plain
-- booking sends the four it needs.
--
-- Returns {granted (1 or 0), delay, now, finish, booked, listening,
-- recovered, other interval, other burst}: the wait in microseconds, the
-- TIME the decision used, the TAT the booking leaves (or would have left),
-- for a bucket the upstream's counters steer its count of units booked
-- after the booking (else 0), 1 when the key's rate listens for a success
-- (see refused.lua), 1 when the key's rate was dropped, back at the
-- configured one, and the limit another process paces the key at (0 0 when
-- all agree: see limits.lua). All are whole numbers, which Redis replies
-- exactly; the last five are left off when all are 0, as they are for a
-- plain booking (see booking_reply in record.lua).
-- The hold, the rate after refusals, the limits' disagreement and the
-- record are seldom there: they are read only when one is. The limits are
-- read when the booking announces its own, or while they disagree.
local seldom = redis.call('EXISTS', KEYS[2], KEYS[3], KEYS[5], KEYS[6]) > 0
local again = seldom and recorded(6)
if again then return again end
local a, b, cost = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local other_a, other_b = 0, 0
if ARGV[7] == '1' or (seldom and redis.call('EXISTS', KEYS[5]) == 1) then
  a, b, other_a, other_b = agree(4, a, b, ARGV[1] .. ' ' .. ARGV[2] .. ' ') -- as limits.lua records them
  if displaced then drop_queue(1, 4) end
end
local arrival = now + tonumber(ARGV[5] or 0)
local stored, steer = read_bucket(1)
local held = seldom and time(2, read(2, 'GET')) or nil
if held and held > arrival then arrival = held end
local rate, recovered = seldom and read_rate(3, held) or nil, 0
if rate and rate_recovered(rate, now) then
  redis.call('DEL', KEYS[3])
  rate, recovered = nil, 1
end
local unit, listening = cost * (steer and interval(steer, a) or a), 0
if rate then
  arrival = rate_allow(rate, arrival, unit)
  if not rate.heard then listening = 1 end
end

if steer then -- the upstream's counters steer it: the general way
  local due = math.max(arrival, bucket_allow(stored, steer, a, b, cost, arrival))
  local finish = bucket_finish(stored, steer, a, b, cost, due, false)
  if due - now > tonumber(ARGV[4]) then
    return booking_reply(0, due - now, finish, 0, listening, recovered, other_a, other_b)
  end
  local booked = book_bucket(1, stored, steer, a, finish, cost, known(tonumber(ARGV[6] or 0), 1, cost), due)
  if rate then rate_booked(rate, 3, due, unit, ARGV[8] == '1') end
  return record(6, booking_reply(1, due - now, finish, booked, listening, recovered, other_a, other_b))
end

-- A bucket not steered, as bucket_allow and bucket_finish book it, in
-- fewer steps: the common case, and 8% of its Redis time.
local tat = arrival
if stored and stored > arrival then tat = stored end
local finish = tat + cost * a
local delay = finish - b * a - now
if delay < arrival - now or cost == 0 then delay = arrival - now end
if delay == 0 and cost > 0 then finish = emptied(finish, a, b, now) end
if delay > tonumber(ARGV[4]) then
  return booking_reply(0, delay, finish, 0, listening, recovered, other_a, other_b)
end
book_bucket(1, stored, nil, a, finish, cost, 0, now + delay)
if rate then rate_booked(rate, 3, now + delay, unit, ARGV[8] == '1') end
return record(6, booking_reply(1, delay, finish, 0, listening, recovered, other_a, other_b))
