-- Holds a key under every limit of its quota: no request goes until the
-- hold ends. Buckets then follow at their rate, as from empty. A hold never
-- shortens one that already reaches further.
--
-- KEYS[i]   limit i's key (see reserve.lua), for i = 1 .. #KEYS - 1
-- KEYS[#KEYS]  the key's hold: when its latest hold ends, so that a process
--           that may have missed the hold's message can read it
-- ARGV[1]   the hold, in microseconds from now
-- ARGV[2]   the Pub/Sub channel that tells the fleet of holds
-- ARGV[3]   the key, as the fleet names it
-- ARGV[3i+1], ARGV[3i+2], ARGV[3i+3]   limit i: its kind (1 bucket,
--           2 sliding, 3 fixed), then a bucket's interval and burst, or a
--           window's length and count
--
-- It publishes "KEY\nEND LENGTH": when the hold ends (Redis's clock) and how
-- long it is, in microseconds. Returns {changed (1 or 0), now}.
local hold_end = now + tonumber(ARGV[1])
local marker = #KEYS
local n = marker - 1

-- Read and check every key before writing any.
local reads, steers = {}, {}
for i = 1, n do
  local kind = tonumber(ARGV[3 * i + 1])
  if kind == 1 then
    reads[i], steers[i] = read_bucket(i)
  elseif kind == 2 then
    reads[i] = time(i, read(i, 'ZREVRANGE', 0, 0, 'WITHSCORES')[2])
  else
    reads[i] = time(i, read(i, 'HGET', 'hold'))
  end
end
local held = time(marker, read(marker, 'GET'))
if held and held >= hold_end then
  return {0, now}
end

for i = 1, n do
  local kind, a, b = tonumber(ARGV[3 * i + 1]), tonumber(ARGV[3 * i + 2]), tonumber(ARGV[3 * i + 3])
  if kind == 1 then
    local target = hold_end + (b - 1) * fleet_interval(steers[i], a)
    if not reads[i] or reads[i] < target then
      if steers[i] then -- the spread of a window's units: the hold says none are left
        steers[i].till, steers[i].spread = 0, 0
      end
      write_bucket(KEYS[i], target, steers[i])
    end
  else
    if kind == 2 and (not reads[i] or reads[i] < hold_end) then
      redis.call('ZADD', KEYS[i], hold_end, 'hold:' .. string.format('%d', hold_end))
    elseif kind == 3 and (not reads[i] or reads[i] < hold_end) then
      redis.call('HSET', KEYS[i], 'hold', string.format('%d', hold_end))
    end
    local expiry = ms_expiry(hold_end + a)
    if redis.call('PEXPIRETIME', KEYS[i]) < expiry then
      redis.call('PEXPIREAT', KEYS[i], expiry)
    end
  end
end
redis.call('SET', KEYS[marker], string.format('%d', hold_end), 'PXAT', ms_expiry(hold_end))

-- Callers already booked and asleep hear of the hold and book anew.
redis.call('PUBLISH', ARGV[2], ARGV[3] .. '\n' .. string.format('%d', hold_end) .. ' ' .. ARGV[1])
return {1, now}
