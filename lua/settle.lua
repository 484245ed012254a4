-- Settles a booking once its actual costs are known, under every limit it
-- was booked in, as an upstream that estimates a request when it starts and
-- corrects its count when it ends does: the difference between the actual
-- cost and the estimate is charged (more) or given back (less), now.
--
-- A bucket's schedule moves by the difference: forward for a debt, which
-- later callers wait for (a debt beyond the burst is paid off at the rate),
-- back for a credit, never before now; a unit moves it as a booking would
-- (see bucket_step in common.lua). A sliding window gains or loses the
-- units at the booking's due time (no more than a window's count are added, and
-- none once that time has left the window). A fixed window's count of the
-- booking's window changes by the difference, never below zero.
--
-- A settlement is idempotent: KEYS[#KEYS] marks the booking as settled for
-- a minute, and a second settlement within it changes nothing.
--
-- KEYS[2i-1] limit i's key; KEYS[2i] its gaps (see refund.lua)
-- KEYS[#KEYS] the booking's mark of settlement
-- ARGV[1]   the request's id; ARGV[2] its due time
-- ARGV[5i-2], ..., ARGV[5i+2]   limit i: its kind (1 bucket, 2 sliding,
--           3 fixed), its interval or window length, its burst or count,
--           and the request's estimated and actual costs under it
-- ARGV[5n+3]  the limits whose costs the booking estimated (see estimated
--           in common.lua): a bucket's CEILING moves by what the request
--           spent under them, by the difference under the others
--
-- Returns {settled (1, or 0 when it had been), now}.
local id, due = ARGV[1], tonumber(ARGV[2])
local mark = #KEYS
local n = (mark - 1) / 2

-- settle_bucket moves a bucket of configured interval a and burst b, its
-- gaps at KEYS[gaps] (how many: gapped), by units, and its CEILING by the
-- units it is known to have spent beyond what its booking counted (spent).
local function settle_bucket(key, gaps, gapped, tat, steer, a, b, units, spent)
  local diff = 0
  if units ~= 0 then diff = units * unit(steer, tat, a, b) end
  count_booked(steer, units)
  move_ceiling(steer, a, spent, now)
  if diff > 0 then
    local base = now
    if tat and tat > now then base = tat end
    write_bucket(key, math.min(base + diff, now + horizon), steer)
  elseif diff < 0 and tat and tat > now then
    if steer then
      moved_back(steer, math.max(bucket_allow(tat, steer, a, b, 1, now), now))
    end
    tat = tat + diff
    if tat > now or steer then
      write_bucket(key, math.max(tat, now), steer)
      if gapped > 0 then -- gaps beyond the new tail no longer stand for anything
        redis.call('ZREMRANGEBYSCORE', gaps, '(' .. string.format('%d', tat), '+inf')
      end
    else
      redis.call('DEL', key, gaps)
    end
  elseif steer and (units ~= 0 or spent ~= 0) then -- its count of units booked, or its CEILING, changed
    write_bucket(key, tat, steer)
  end
end

local function settle_sliding(key, a, b, estimate, actual)
  for j = actual + 1, estimate do
    redis.call('ZREM', key, id .. ':' .. j)
  end
  local expiry = ms_expiry(due + a + guard(a))
  if actual <= estimate or expiry <= ms_expiry(now) then
    return
  end
  for j = estimate + 1, math.min(actual, estimate + b) do
    redis.call('ZADD', key, due, id .. ':' .. j)
  end
  if redis.call('PEXPIRETIME', key) < expiry then
    redis.call('PEXPIREAT', key, expiry)
  end
end

-- Read and check every key before writing any: each bucket's TAT and
-- count of gaps, and the count of a fixed window's booked window. A limit
-- whose actual cost is its booked one, not an estimate, is left as it is,
-- unread (kind 0).
local mask = tonumber(ARGV[5 * n + 3])
local kinds, tats, fields, used, steers = {}, {}, {}, {}, {}
for i = 1, n do
  kinds[i] = tonumber(ARGV[5 * i - 2])
  if ARGV[5 * i + 1] == ARGV[5 * i + 2] and not estimated(mask, i) then
    kinds[i] = 0
  else
    tats[i], fields[i], used[i], steers[i] = read_booking(i, kinds[i], ARGV[5 * i - 1], due, true)
  end
end
if not redis.call('SET', KEYS[mark], '1', 'NX', 'PX', 60000) then
  return {0, now}
end

for i = 1, n do
  local a, b = tonumber(ARGV[5 * i - 1]), tonumber(ARGV[5 * i])
  local estimate, actual = tonumber(ARGV[5 * i + 1]), tonumber(ARGV[5 * i + 2])
  local key = KEYS[2 * i - 1]
  if kinds[i] == 1 then
    local spent = actual - known(mask, i, estimate)
    settle_bucket(key, KEYS[2 * i], used[i], tats[i], steers[i], a, b, actual - estimate, spent)
  elseif kinds[i] == 2 then
    settle_sliding(key, a, b, estimate, actual)
  elseif used[i] then
    local diff = math.max(actual - estimate, -used[i])
    if diff ~= 0 then -- HINCRBY refuses a negative zero
      redis.call('HINCRBY', key, fields[i], diff)
    end
  end
end
return {1, now}
