-- Gives back the tokens of a booking whose caller stopped waiting.
--
-- A booking at the tail of the schedule (its finish is the TAT) is undone by
-- moving the TAT back. A booking with others behind it cannot be undone
-- without handing its slot to two callers, so it is kept as a gap; when the
-- bookings behind it are given back too, the gap joins the tail and is undone
-- as well. Callers cancelled together get everything back, in any order.
--
-- KEYS[1]  the bucket (see reserve.lua)
-- KEYS[2]  the gaps: a sorted set of cancelled bookings not yet at the tail,
--          members "finish:size", scored by finish
-- ARGV[1]  finish: the TAT the booking left
-- ARGV[2]  size: microseconds the booking added (cost * interval)
--
-- Returns {result, now}: result 1 when the tokens went back into the bucket,
-- 2 when the booking was kept as a gap, 0 when there was nothing to give back
-- (its time has passed, or the bucket is no longer the one it was booked in);
-- now is the TIME it used, in microseconds.
local clock = redis.call('TIME')
local now = clock[1] * 1000000 + clock[2]
local finish = tonumber(ARGV[1])
local size = tonumber(ARGV[2])

local tat = tonumber(redis.call('GET', KEYS[1]))
if not tat or finish <= now or finish > tat then
  return {0, now}
end
if finish < tat then
  redis.call('ZADD', KEYS[2], finish, ARGV[1] .. ':' .. ARGV[2])
  redis.call('PEXPIREAT', KEYS[2], (tat - tat % 1000000) / 1000 + 1000)
  return {2, now}
end

tat = finish - size
while true do
  local top = redis.call('ZRANGE', KEYS[2], -1, -1)[1]
  if not top then break end
  local gap_finish, gap_size = string.match(top, '^(%d+):(%d+)$')
  if tonumber(gap_finish) ~= tat then break end
  tat = tat - tonumber(gap_size)
  redis.call('ZREM', KEYS[2], top)
end

if tat > now then
  -- the same expiry as reserve.lua gives: the end of the TAT's second
  redis.call('SET', KEYS[1], string.format('%d', tat), 'PXAT', (tat - tat % 1000000) / 1000 + 1000)
  redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
else
  redis.call('DEL', KEYS[1], KEYS[2])
end
return {1, now}
