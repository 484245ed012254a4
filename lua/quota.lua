-- Books cost units under every limit of a quota, all of them or, when the
-- wait would exceed the caller's budget, none, and returns the exact wait.
--
-- KEYS[i]   limit i's key: a bucket's schedule (a string: its theoretical
--           arrival time, TAT), a sliding window's grants (a sorted set of
--           their times), or a fixed window's counts (a hash, by window)
-- ARGV[1]   cost: how many units the caller wants
-- ARGV[2]   budget: the longest wait the caller accepts, in microseconds,
--           or -1 for no limit
-- ARGV[3]   the request's id, which names its grants in sliding windows
-- ARGV[3i+1], ARGV[3i+2], ARGV[3i+3]   limit i: its kind (1 bucket,
--           2 sliding window, 3 fixed window), then a bucket's interval
--           (microseconds one unit adds to the schedule) and burst, or a
--           window's length in microseconds and count
--
-- All times are integer microseconds of Redis's clock. Returns {granted (1
-- or 0), delay, now, finish_1, ..., finish_n}: the wait, the TIME the
-- decision used (the request goes at now + delay), and each bucket's TAT
-- after the booking (0 for windows). reserve.lua is the same for one bucket.
local clock = redis.call('TIME')
local now = clock[1] * 1000000 + clock[2]
local cost = tonumber(ARGV[1])
local n = #KEYS
local kinds, as, bs, stored = {}, {}, {}, {}
local slot = now

-- A sliding window leaves a guard between a grant and the one that takes its
-- place, so that the jitter between a grant and its arrival upstream does
-- not crowd two into one window: a fiftieth of the window, at most 50 ms.
local function guard(length)
  return math.min(length - length % 50, 2500000) / 50
end

-- Every bucket and sliding window allows any time from a threshold on.
for i = 1, n do
  local kind, a, b = tonumber(ARGV[3 * i + 1]), tonumber(ARGV[3 * i + 2]), tonumber(ARGV[3 * i + 3])
  kinds[i], as[i], bs[i] = kind, a, b
  if kind == 1 then
    local v = redis.call('GET', KEYS[i])
    if v then
      stored[i] = tonumber(v)
      if not stored[i] then
        return redis.error_reply('pace: bucket ' .. KEYS[i] .. ' holds a value that is not a number')
      end
    end
    local tat = now
    if stored[i] and stored[i] > now then tat = stored[i] end
    local allow = tat + cost * a - b * a
    if allow > slot then slot = allow end
  elseif kind == 2 then
    local latest = redis.call('ZREVRANGE', KEYS[i], 0, 0, 'WITHSCORES')[2]
    if latest and tonumber(latest) > slot then slot = tonumber(latest) end
    local nth = redis.call('ZREVRANGE', KEYS[i], b - cost, b - cost, 'WITHSCORES')[2]
    if nth and tonumber(nth) + a + guard(a) > slot then slot = tonumber(nth) + a + guard(a) end
  else
    local hold = tonumber(redis.call('HGET', KEYS[i], 'hold'))
    if hold and hold > slot then slot = hold end
  end
end

-- A fixed window allows the windows with room: move on to the first one,
-- until every fixed window agrees (the thresholds above stay met).
local windows = {}
local moved = true
while moved do
  moved = false
  for i = 1, n do
    if kinds[i] == 3 then
      local w = (slot - slot % as[i]) / as[i]
      local room = false
      for _ = 1, 64 do
        local used = tonumber(redis.call('HGET', KEYS[i], string.format('%d', w))) or 0
        if used + cost <= bs[i] then
          room = true
          break
        end
        w = w + 1
      end
      if not room then
        return redis.error_reply('pace: fixed window ' .. KEYS[i] .. ' is booked more than 64 windows ahead')
      end
      if w * as[i] > slot then
        slot = w * as[i]
        moved = true
      end
      windows[i] = w
    end
  end
end

-- Each bucket books as if the request arrived at the slot.
local reply = {0, slot - now, now}
for i = 1, n do
  reply[3 + i] = 0
  if kinds[i] == 1 then
    local base = slot
    if stored[i] and stored[i] > base then base = stored[i] end
    reply[3 + i] = base + cost * as[i]
  end
end
local budget = tonumber(ARGV[2])
if budget >= 0 and slot - now > budget then
  return reply
end

reply[1] = 1
for i = 1, n do
  local a = as[i]
  if kinds[i] == 1 then
    local finish = reply[3 + i]
    -- The key expires at the end of the second in which the bucket is full
    -- again. While the TAT stays within one second the expiry stands, and
    -- KEEPTTL spares Redis the cost of setting it anew on every booking.
    local second = finish - finish % 1000000
    if stored[i] and stored[i] - stored[i] % 1000000 == second then
      redis.call('SET', KEYS[i], string.format('%d', finish), 'KEEPTTL')
    else
      redis.call('SET', KEYS[i], string.format('%d', finish), 'PXAT', second / 1000 + 1000)
    end
  elseif kinds[i] == 2 then
    for j = 1, cost do
      redis.call('ZADD', KEYS[i], slot, ARGV[3] .. ':' .. j)
    end
    -- Only the last count grants matter, and none older than a window.
    redis.call('ZREMRANGEBYRANK', KEYS[i], 0, -bs[i] - 1)
    redis.call('ZREMRANGEBYSCORE', KEYS[i], '-inf', now - a - guard(a))
    redis.call('PEXPIREAT', KEYS[i], (slot + a + guard(a) - (slot + a + guard(a)) % 1000) / 1000 + 1)
  else
    local w = windows[i]
    redis.call('HINCRBY', KEYS[i], string.format('%d', w), cost)
    local current = (now - now % a) / a
    redis.call('HDEL', KEYS[i], string.format('%d', current - 1), string.format('%d', current - 2))
    -- The counts expire with the last window booked: never a key without
    -- an expiry, never one cut short.
    local expiry = ((w + 1) * a - ((w + 1) * a) % 1000) / 1000 + 1
    if redis.call('PEXPIRETIME', KEYS[i]) < expiry then
      redis.call('PEXPIREAT', KEYS[i], expiry)
    end
  end
end
return reply
