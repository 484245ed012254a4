-- Holds a key: no request of it goes, in any process, before the hold ends.
-- A hold pauses the key; it does not spend its limits: when it ends, each
-- bucket has the tokens it had, and those it refilled meanwhile, and each
-- window its room. A hold never shortens one that already reaches further.
--
-- KEYS[i]   limit i's key (see reserve.lua), for i = 1 .. #KEYS - 1
-- KEYS[#KEYS]  the key's hold: when its latest hold ends, which every
--           booking reads, and a process that may have missed the hold's
--           message too
-- ARGV[1]   the hold, in microseconds from now
-- ARGV[2]   the Pub/Sub channel that tells the fleet of holds
-- ARGV[3]   the key, as the fleet names it
-- ARGV[3i+1], ARGV[3i+2], ARGV[3i+3]   limit i: its kind (1 bucket,
--           2 sliding, 3 fixed), then a bucket's interval and burst, or a
--           window's length and count
--
-- A bucket the upstream's counters steer takes its next reading afresh, as
-- its first: across the hold, the upstream's quota filled up, and the
-- refills it lost are nobody's spending.
--
-- It publishes "KEY\nEND LENGTH": when the hold ends (Redis's clock) and how
-- long it is, in microseconds. Returns {changed (1 or 0), now}.
local hold_end = now + tonumber(ARGV[1])
local marker = #KEYS

-- Read and check every key before writing any.
local tats, steers = {}, {}
for i = 1, marker - 1 do
  if tonumber(ARGV[3 * i + 1]) == 1 then
    tats[i], steers[i] = read_bucket(i)
  end
end
local held = time(marker, read(marker, 'GET'))
if held and held >= hold_end then
  return {0, now}
end

for i = 1, marker - 1 do
  if steers[i] and steers[i].seen ~= 0 then
    steers[i].seen = 0
    write_bucket(KEYS[i], tats[i], steers[i])
  end
end
redis.call('SET', KEYS[marker], string.format('%d', hold_end), 'PXAT', ms_expiry(hold_end))

-- Callers already booked and asleep hear of the hold and book anew.
redis.call('PUBLISH', ARGV[2], ARGV[3] .. '\n' .. string.format('%d', hold_end) .. ' ' .. ARGV[1])
return {1, now}
