-- Books on a key what one process granted alone while Redis was away from
-- it (see repay.go), so that the grants the others made in Redis meanwhile
-- and its own do not both count as the limit's. Each limit takes what it
-- has free now and at most one burst (a window's count) beyond, so that a
-- debt costs the fleet one refill period at most, however long the outage
-- was. A steered bucket takes nothing: the upstream's counters saw the
-- grants, and steer it.
--
-- A bucket is also spent through the last turn Redis gave the process
-- while it returned (see spent_through).
--
-- KEYS[i]   limit i's key (see quota.lua)
-- ARGV[1]   the id that names the debt's grants in sliding windows
-- ARGV[4i-2], ARGV[4i-1], ARGV[4i], ARGV[4i+1]   limit i: its kind (1
--           bucket, 2 sliding window, 3 fixed window), a bucket's interval
--           and burst or a window's length and count, and the debt under it
-- ARGV[4n+2]  the last turn Redis gave the process while it returned, in
--           microseconds from now (0: none ahead)
-- ARGV[4n+3]  the fleet's processes, each of which paced a share
--
-- Returns {now, booked_1, ..., booked_n}: the units each limit took.
local n = #KEYS
local kinds, as, bs, debts, tats, steers = {}, {}, {}, {}, {}, {}
for i = 1, n do
  kinds[i], as[i], bs[i], debts[i] = tonumber(ARGV[4 * i - 2]), tonumber(ARGV[4 * i - 1]), tonumber(ARGV[4 * i]), tonumber(ARGV[4 * i + 1])
  if kinds[i] == 1 then
    tats[i], steers[i] = read_bucket(i)
  elseif kinds[i] == 2 then
    read(i, 'ZCARD')
  else
    read(i, 'HLEN')
  end
end

-- spent_through is a bucket's TAT once the fleet's turns until the
-- process's last, at last, and the other shares' after it (one share's
-- interval, shares units, at most) left it empty. While a process
-- returns, it goes at its outage share's turns, and Redis books each as
-- arriving then (reserve.lua's not before), after a TAT that never saw
-- the outage: with the burst free before it. Once the share lifted, the
-- process's bookings took that burst early, beside the turns still to
-- go, at an upstream the shares had spent at its rate all along (a kill of
-- Redis for 1.3 s of 8, simulated, 4 x 8 at 200/s: a refusal, the rate
-- cut, 97.3% to 97.9% of the quota).
local function spent_through(tat, a, b, last, shares)
  if last <= now then return tat end
  return math.max(tat or now, math.min(last + shares * a, now + horizon) + b * a)
end

-- repay_bucket moves the schedule on, spent through last, by the debt, up
-- to an empty bucket and one burst more (from now: the turns that spent it
-- through last were the outage's shares', which granted the debt).
local function repay_bucket(i, tat, a, b, debt, last, shares)
  local from = math.max(spent_through(tat, a, b, last, shares) or now, now)
  local units = math.max(math.min(debt, math.floor((math.min(now + 2 * b * a, now + horizon) - from) / a)), 0)
  local finish = from + units * a
  if finish > math.max(tat or now, now) then
    redis.call('SET', KEYS[i], string.format('%d', finish), 'PXAT', full_expiry(finish))
  end
  return units
end

-- repay_sliding adds the debt's grants at now, up to a full window and one
-- window more; a window counts only its last count grants, so those beyond
-- it hold the grants of others back in turn.
local function repay_sliding(i, a, b, debt, id)
  local key = KEYS[i]
  local held = redis.call('ZCOUNT', key, now - a - guard(a), '+inf')
  local units = math.max(math.min(debt, 2 * b - held), 0)
  for j = 1, units do
    redis.call('ZADD', key, now, id .. ':' .. j)
  end
  if units > 0 and redis.call('PEXPIRETIME', key) < ms_expiry(now + a + guard(a)) then
    redis.call('PEXPIREAT', key, ms_expiry(now + a + guard(a)))
  end
  return units
end

-- repay_fixed counts the debt in the current window, up to its count, and
-- the rest in the next one.
local function repay_fixed(i, spec, b, debt)
  local key = KEYS[i]
  local left, finish, at = debt, now, now
  for _ = 1, 2 do
    local start, ends, field = window_at(spec, at)
    if not start then break end -- beyond the windows of a calendar told
    at, finish = ends, ends
    local used = number(i, redis.call('HGET', key, field), 2^53) or 0
    local units = math.max(math.min(left, b - used), 0)
    if units > 0 then
      redis.call('HINCRBY', key, field, units)
      left = left - units
    end
  end
  local expiry = ms_expiry(finish)
  if debt > left and redis.call('PEXPIRETIME', key) < expiry then
    redis.call('PEXPIREAT', key, expiry)
  end
  return debt - left
end

local reply = {now}
for i = 1, n do
  local units = 0
  if kinds[i] == 1 and not steers[i] then
    units = repay_bucket(i, tats[i], as[i], bs[i], debts[i], now + tonumber(ARGV[4 * n + 2] or 0), tonumber(ARGV[4 * n + 3] or 1))
  elseif kinds[i] == 2 then
    units = repay_sliding(i, as[i], bs[i], debts[i], ARGV[1])
  elseif kinds[i] == 3 then
    units = repay_fixed(i, ARGV[4 * i - 1], bs[i], debts[i])
  end
  reply[i + 1] = units
end
return reply
