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
-- ARGV[4]  budget: the longest wait the caller accepts, in microseconds,
--          or -1 for no limit
--
-- Returns {granted (1 or 0), delay, now, finish}: the wait in microseconds,
-- the TIME the decision used, and the TAT the booking leaves (or would have
-- left). All are whole numbers, which Redis replies exactly.
local clock = redis.call('TIME')
local now = clock[1] * 1000000 + clock[2]
local interval = tonumber(ARGV[1])

local stored = redis.call('GET', KEYS[1])
local tat = now
if stored then
  stored = tonumber(stored)
  if not stored then
    return redis.error_reply('pace: bucket ' .. KEYS[1] .. ' holds a value that is not a number')
  end
  if stored > now then tat = stored end
end

local finish = tat + ARGV[3] * interval
local delay = finish - ARGV[2] * interval - now
if delay < 0 then delay = 0 end
local budget = tonumber(ARGV[4])
if budget >= 0 and delay > budget then
  return {0, delay, now, finish}
end

-- The key expires at the end of the second in which the bucket is full
-- again. While the TAT stays within one second the expiry stands, and
-- KEEPTTL spares Redis the cost of setting it anew on every booking.
local second = finish - finish % 1000000
if stored and stored - stored % 1000000 == second then
  redis.call('SET', KEYS[1], string.format('%d', finish), 'KEEPTTL')
else
  redis.call('SET', KEYS[1], string.format('%d', finish), 'PXAT', second / 1000 + 1000)
end
return {1, delay, now, finish}
