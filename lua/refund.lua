-- Gives back a booking whose caller stopped waiting, under every limit it
-- was booked in.
--
-- A bucket booking at the tail of the schedule (its finish is the TAT) is
-- undone by moving the TAT back. One with others behind it cannot be undone
-- without handing its slot to two callers, so it is kept as a gap; when the
-- bookings behind it are given back too, the gap joins the tail and is undone
-- as well. Callers cancelled together get everything back, in any order. A
-- window booking is simply taken out.
--
-- KEYS[2i-1] limit i's key (see reserve.lua); KEYS[2i] its gaps: a sorted
--           set of cancelled bucket bookings not yet at the tail, members
--           "finish:size", scored by finish (unused for windows)
-- ARGV[1]   the request's id; ARGV[2] its cost; ARGV[3] its slot
-- ARGV[3i+1], ARGV[3i+2], ARGV[3i+3]   limit i: its kind (1 bucket,
--           2 sliding, 3 fixed), its interval or window length, and the
--           bucket's finish (the TAT the booking left; 0 for windows)
--
-- Returns {now, result_1, ..., result_n}: for a bucket, 1 when the tokens
-- went back, 2 when the booking was kept as a gap, 0 when there was nothing
-- to give back (its time has passed, or the bucket is no longer the one it
-- was booked in); for a window, 1 when the booking was taken out, else 0.
local clock = redis.call('TIME')
local now = clock[1] * 1000000 + clock[2]
local cost = tonumber(ARGV[2])
local slot = tonumber(ARGV[3])

local function refund_bucket(key, gaps, finish, size)
  local tat = tonumber(redis.call('GET', key))
  if not tat or finish <= now or finish > tat then
    return 0
  end
  if finish < tat then
    redis.call('ZADD', gaps, finish, string.format('%d:%d', finish, size))
    redis.call('PEXPIREAT', gaps, (tat - tat % 1000000) / 1000 + 1000)
    return 2
  end
  tat = finish - size
  while true do
    local top = redis.call('ZRANGE', gaps, -1, -1)[1]
    if not top then break end
    local gap_finish, gap_size = string.match(top, '^(%d+):(%d+)$')
    if tonumber(gap_finish) ~= tat then break end
    tat = tat - tonumber(gap_size)
    redis.call('ZREM', gaps, top)
  end
  if tat > now then
    -- the same expiry as reserve.lua gives: the end of the TAT's second
    redis.call('SET', key, string.format('%d', tat), 'PXAT', (tat - tat % 1000000) / 1000 + 1000)
    redis.call('ZREMRANGEBYSCORE', gaps, '-inf', now)
  else
    redis.call('DEL', key, gaps)
  end
  return 1
end

local reply = {now}
for i = 1, #KEYS / 2 do
  local kind, a, finish = tonumber(ARGV[3 * i + 1]), tonumber(ARGV[3 * i + 2]), tonumber(ARGV[3 * i + 3])
  local key = KEYS[2 * i - 1]
  local result = 0
  if kind == 1 then
    result = refund_bucket(key, KEYS[2 * i], finish, cost * a)
  elseif kind == 2 then
    for j = 1, cost do
      result = math.max(result, redis.call('ZREM', key, ARGV[1] .. ':' .. j))
    end
  elseif slot > now then
    local field = string.format('%d', (slot - slot % a) / a)
    if redis.call('HEXISTS', key, field) == 1 then
      redis.call('HINCRBY', key, field, -cost)
      result = 1
    end
  end
  reply[i + 1] = result
end
return reply
