-- Books a request under every limit of a quota, each at its own cost, all
-- of them or, when the wait would exceed the caller's budget, none, and
-- returns the exact wait.
--
-- KEYS[i]   limit i's key, for i = 1 .. #KEYS - 3: a bucket's schedule (a
--           string: its theoretical arrival time, TAT), a sliding window's
--           grants (a sorted set of their times, a member a unit), or a fixed
--           window's counts (a hash, by window)
-- KEYS[#KEYS - 2]  the key's hold (see hold.lua): no request goes before it
--           ends
-- KEYS[#KEYS - 1]  the key's rate after refusals (see rate.lua), which
--           holds the request too: by the time the fastest limit the request
--           costs anything under takes to refill its cost
-- KEYS[#KEYS]  the record of the call (see record.lua)
-- ARGV[1]   budget: the longest wait the caller accepts, in microseconds
-- ARGV[2]   not before: the caller cannot go sooner than this many
--           microseconds from now
-- ARGV[3]   the request's id, which names its grants in sliding windows
-- ARGV[4i], ARGV[4i+1], ARGV[4i+2], ARGV[4i+3]   limit i: its kind (1
--           bucket, 2 sliding window, 3 fixed window), then a bucket's
--           interval (microseconds one unit adds to the schedule) and burst,
--           or a window's length in microseconds (a fixed window's windows,
--           see window_at) and count; then the request's cost under it
-- ARGV[4n+4]  the limits whose costs are a reservation's estimates (see
--           estimated in common.lua)
-- ARGV[4n+5]  1 when the request is booked anew, its booking displaced by
--           a hold or a retime (see rate_book), else 0
--
-- All times are integer microseconds of Redis's clock. Returns {granted (1
-- or 0), delay, now, finish_1, ..., finish_n, booked_1, ..., booked_n,
-- listening, recovered}: the wait, the TIME the decision used (the request
-- goes at now + delay), each bucket's TAT after the booking (0 for
-- windows), each steered bucket's count of units booked after it (else 0),
-- 1 when the key's rate listens for a success, and 1 when the key's rate was
-- dropped, back at the configured one. reserve.lua is the same for one
-- bucket.
-- The hold, the rate after refusals and the record are seldom there: they
-- are read only when one is.
local n = #KEYS - 3
local seldom = any_exists(n + 1, n + 2, n + 3)
local again = seldom and recorded(n + 3)
if again then return again end
local kinds, as, bs, costs, stored, steers, specs = {}, {}, {}, {}, {}, {}, {}
local due = now + tonumber(ARGV[2])
local held = seldom and time(n + 1, read(n + 1, 'GET')) or nil
if held and held > due then due = held end
local unit = nil -- see rate.lua

-- Every bucket and sliding window allows any time from a threshold on.
for i = 1, n do
  local kind, a, b, cost = tonumber(ARGV[4 * i]), tonumber(ARGV[4 * i + 1]), tonumber(ARGV[4 * i + 2]), tonumber(ARGV[4 * i + 3])
  kinds[i], as[i], bs[i], costs[i], specs[i] = kind, a, b, cost, ARGV[4 * i + 1]
  if kind == 1 then
    stored[i], steers[i] = read_bucket(i)
    local allow = bucket_allow(stored[i], steers[i], a, b, cost, now)
    if allow > due then due = allow end
  elseif kind == 2 then
    local latest = time(i, read(i, 'ZREVRANGE', 0, 0, 'WITHSCORES')[2])
    if latest and latest > due then due = latest end
    local nth = time(i, redis.call('ZREVRANGE', KEYS[i], b - cost, b - cost, 'WITHSCORES')[2])
    if nth and nth + a + guard(a) > due then due = nth + a + guard(a) end
  else
    read(i, 'HLEN')
    local start, finish = window_at(specs[i], now)
    if not start then
      foreign(i, 'is a window of a calendar that does not hold the time of Redis: its process\'s clock is a window off')
    end
    a = finish - start
  end
  local per = math.ceil(a / b) -- a unit's time: a window's length over its count
  if kind == 1 then per = interval(steers[i], a) end
  if cost > 0 and (not unit or cost * per < unit) then unit = cost * per end
end

local rate, recovered, listening = seldom and read_rate(n + 2, held) or nil, 0, 0
if rate and rate_recovered(rate, now) then
  rate, recovered = nil, 1 -- dropped below, once every key is read
end
if rate then
  due = rate_allow(rate, due, unit or 0)
  if not rate.heard then listening = 1 end
end

-- A fixed window allows the windows with room: move on to the first one,
-- until every fixed window agrees (the thresholds above stay met). None
-- with room within 64 windows (or the calendar's end): the request is
-- refused, as one beyond any wait, the time searched at least.
local windows = {}
local moved, beyond = true, false
while moved and not beyond do
  moved = false
  for i = 1, n do
    if kinds[i] == 3 then
      local start, finish, field = window_at(specs[i], due)
      local room, searched = false, due
      for _ = 1, 64 do
        if not start then break end
        local used = number(i, redis.call('HGET', KEYS[i], field), 2^53) or 0
        if used + costs[i] <= bs[i] then
          room = true
          break
        end
        searched = finish
        start, finish, field = window_at(specs[i], finish)
      end
      if not room then
        due, beyond = math.max(searched, now + tonumber(ARGV[1]) + 1), true
        break
      end
      if start > due then
        due = start
        moved = true
      end
      windows[i] = {field, finish}
    end
  end
end

if recovered == 1 then
  redis.call('DEL', KEYS[n + 2])
end

-- Each bucket books as if the request arrived at its due time.
local reply = {0, due - now, now}
for i = 1, n do
  reply[3 + i], reply[3 + n + i] = 0, 0
  if kinds[i] == 1 then
    reply[3 + i] = bucket_finish(stored[i], steers[i], as[i], bs[i], costs[i], due, due == now)
  end
end
reply[2 * n + 4], reply[2 * n + 5] = listening, recovered
if due - now > tonumber(ARGV[1]) then
  return reply
end

reply[1] = 1
if rate then rate_booked(rate, n + 2, due, unit or 0, ARGV[4 * n + 5] == '1') end
for i = 1, n do
  local a = as[i]
  if kinds[i] == 1 then
    reply[3 + n + i] = book_bucket(i, stored[i], steers[i], a, reply[3 + i], costs[i], known(tonumber(ARGV[4 * n + 4]), i, costs[i]), due)
  elseif kinds[i] == 2 then
    for j = 1, costs[i] do
      redis.call('ZADD', KEYS[i], due, ARGV[3] .. ':' .. j)
    end
    -- Only the last count grants matter, and none older than a window.
    redis.call('ZREMRANGEBYRANK', KEYS[i], 0, -bs[i] - 1)
    redis.call('ZREMRANGEBYSCORE', KEYS[i], '-inf', now - a - guard(a))
    redis.call('PEXPIREAT', KEYS[i], ms_expiry(due + a + guard(a)))
  else
    local field, finish = windows[i][1], windows[i][2]
    redis.call('HINCRBY', KEYS[i], field, costs[i])
    -- The two windows before now's are over.
    local start = window_at(specs[i], now)
    for _ = 1, 2 do
      local before, _, old = window_at(specs[i], start - 1)
      if not before then break end
      redis.call('HDEL', KEYS[i], old)
      start = before
    end
    -- The counts expire with the last window booked: never a key without
    -- an expiry, never one cut short.
    local expiry = ms_expiry(finish)
    if redis.call('PEXPIRETIME', KEYS[i]) < expiry then
      redis.call('PEXPIREAT', KEYS[i], expiry)
    end
  end
end
return record(n + 3, reply)
