-- Gives back a booking whose caller stopped waiting, under every limit it
-- was booked in.
--
-- A bucket booking at the tail of the schedule (its finish is the TAT) is
-- undone by moving the TAT back. One with others behind it cannot be undone
-- without handing its time to two callers, so it is kept as a gap; when the
-- bookings behind it are given back too, the gap joins the tail and is undone
-- as well. Callers cancelled together get everything back, in any order. A
-- window booking is simply taken out.
--
-- KEYS[2i-1] limit i's key (see reserve.lua); KEYS[2i] its gaps: a sorted
--           set of cancelled bucket bookings not yet at the tail, members
--           "finish:size", scored by finish (unused for windows)
-- ARGV[1]   the request's id; ARGV[2] its due time
-- ARGV[4i-1], ARGV[4i], ARGV[4i+1], ARGV[4i+2]   limit i: its kind (1
--           bucket, 2 sliding, 3 fixed), its interval or window length, the
--           request's cost under it, and the bucket's finish (the TAT the
--           booking left; 0 for windows)
--
-- Returns {now, result_1, ..., result_n}: for a bucket, 1 when the tokens
-- went back, 2 when the booking was kept as a gap, 0 when there was nothing
-- to give back (its time has passed, the bucket is no longer the one it was
-- booked in, or the upstream's counters steer it); for a window, 1 when the
-- booking was taken out, else 0.
local due = tonumber(ARGV[2])
local n = #KEYS / 2

local function refund_bucket(key, gaps, tat, steer, finish, size)
  if not tat or steer or finish <= now or finish > tat then
    return 0 -- a steered bucket keeps it: its schedule is the upstream's
  end
  if finish < tat then
    redis.call('ZADD', gaps, finish, string.format('%d:%d', finish, size))
    redis.call('PEXPIREAT', gaps, full_expiry(tat))
    return 2
  end
  tat = finish - size
  while true do
    local top = redis.call('ZRANGE', gaps, -1, -1)[1]
    local gap_finish, gap_size = string.match(top or '', '^(%d+):(%d+)$')
    if tonumber(gap_finish) ~= tat then break end
    tat = tat - tonumber(gap_size)
    redis.call('ZREM', gaps, top)
  end
  if tat > now then
    redis.call('SET', key, string.format('%d', tat), 'PXAT', full_expiry(tat))
    redis.call('ZREMRANGEBYSCORE', gaps, '-inf', now)
  else
    redis.call('DEL', key, gaps)
  end
  return 1
end

-- Read and check every key before writing any: each bucket's TAT, and
-- the count of a fixed window's booked window while it is still ahead.
local kinds, tats, fields, used, steers = {}, {}, {}, {}, {}
for i = 1, n do
  kinds[i] = tonumber(ARGV[4 * i - 1])
  tats[i], fields[i], used[i], steers[i] = read_booking(i, kinds[i], ARGV[4 * i], due, due > now)
end

local reply = {now}
for i = 1, n do
  local a, cost, finish = tonumber(ARGV[4 * i]), tonumber(ARGV[4 * i + 1]), tonumber(ARGV[4 * i + 2])
  local key = KEYS[2 * i - 1]
  local result = 0
  if kinds[i] == 1 then
    result = refund_bucket(key, KEYS[2 * i], tats[i], steers[i], finish, cost * a)
  elseif kinds[i] == 2 then
    for j = 1, cost do
      result = math.max(result, redis.call('ZREM', key, ARGV[1] .. ':' .. j))
    end
  elseif used[i] then
    if cost > 0 and used[i] > 0 then -- HINCRBY refuses a negative zero
      redis.call('HINCRBY', key, fields[i], -math.min(cost, used[i]))
    end
    result = 1
  end
  reply[i + 1] = result
end
return reply
