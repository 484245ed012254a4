-- Holds a bucket: the next booking waits until the hold ends, and the ones
-- after it follow at the rate, as from an empty bucket. A hold never
-- shortens a schedule that already reaches further.
--
-- KEYS[1]  the bucket (see reserve.lua)
-- ARGV[1]  the hold, in microseconds from now
-- ARGV[2]  interval: microseconds one token adds to the schedule
-- ARGV[3]  burst: how many tokens the bucket holds
-- ARGV[4]  the Pub/Sub channel that tells the fleet of holds
-- ARGV[5]  the key, as the fleet names it
--
-- It publishes "KEY\nEND LENGTH": when the hold ends (Redis's clock) and how
-- long it is, in microseconds.
-- Returns {changed (1 or 0), now}: whether the hold moved the schedule, and
-- the TIME it used.
local clock = redis.call('TIME')
local now = clock[1] * 1000000 + clock[2]
local target = now + tonumber(ARGV[1]) + (tonumber(ARGV[3]) - 1) * tonumber(ARGV[2])

local stored = redis.call('GET', KEYS[1])
if stored then
  stored = tonumber(stored)
  if not stored then
    return redis.error_reply('pace: bucket ' .. KEYS[1] .. ' holds a value that is not a number')
  end
  if stored >= target then
    return {0, now}
  end
end
-- Callers already booked and asleep hear of the hold and book anew.
redis.call('PUBLISH', ARGV[4], ARGV[5] .. '\n' .. string.format('%d', now + ARGV[1]) .. ' ' .. ARGV[1])
-- the expiry of reserve.lua: the end of the second in which the bucket is full
local second = target - target % 1000000
redis.call('SET', KEYS[1], string.format('%d', target), 'PXAT', second / 1000 + 1000)
return {1, now}
