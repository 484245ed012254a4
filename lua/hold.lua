-- Holds a key under every limit of its quota: no request goes until the
-- hold ends. Buckets then follow at their rate, as from empty. A hold never
-- shortens one that already reaches further.
--
-- KEYS[i]   limit i's key (see reserve.lua)
-- ARGV[1]   the hold, in microseconds from now
-- ARGV[2]   the Pub/Sub channel that tells the fleet of holds
-- ARGV[3]   the key, as the fleet names it
-- ARGV[3i+1], ARGV[3i+2], ARGV[3i+3]   limit i: its kind (1 bucket,
--           2 sliding, 3 fixed), then a bucket's interval and burst, or a
--           window's length and count
--
-- It publishes "KEY\nEND LENGTH": when the hold ends (Redis's clock) and how
-- long it is, in microseconds. Returns {changed (1 or 0), now}.
local clock = redis.call('TIME')
local now = clock[1] * 1000000 + clock[2]
local hold_end = now + tonumber(ARGV[1])
local changed = 0

for i = 1, #KEYS do
  local kind, a, b = tonumber(ARGV[3 * i + 1]), tonumber(ARGV[3 * i + 2]), tonumber(ARGV[3 * i + 3])
  if kind == 1 then
    local target = hold_end + (b - 1) * a
    local stored = redis.call('GET', KEYS[i])
    if stored and not tonumber(stored) then
      return redis.error_reply('pace: bucket ' .. KEYS[i] .. ' holds a value that is not a number')
    end
    if not stored or tonumber(stored) < target then
      -- the expiry of reserve.lua: the end of the second in which the bucket is full
      local second = target - target % 1000000
      redis.call('SET', KEYS[i], string.format('%d', target), 'PXAT', second / 1000 + 1000)
      changed = 1
    end
  else
    local expiry = (hold_end + a - (hold_end + a) % 1000) / 1000 + 1
    if kind == 2 then
      local latest = redis.call('ZREVRANGE', KEYS[i], 0, 0, 'WITHSCORES')[2]
      if not latest or tonumber(latest) < hold_end then
        redis.call('ZADD', KEYS[i], hold_end, 'hold:' .. string.format('%d', hold_end))
        changed = 1
      end
    else
      local held = tonumber(redis.call('HGET', KEYS[i], 'hold'))
      if not held or held < hold_end then
        redis.call('HSET', KEYS[i], 'hold', string.format('%d', hold_end))
        changed = 1
      end
    end
    if redis.call('PEXPIRETIME', KEYS[i]) < expiry then
      redis.call('PEXPIREAT', KEYS[i], expiry)
    end
  end
end

if changed == 1 then
  -- Callers already booked and asleep hear of the hold and book anew.
  redis.call('PUBLISH', ARGV[2], ARGV[3] .. '\n' .. string.format('%d', hold_end) .. ' ' .. ARGV[1])
end
return {changed, now}
