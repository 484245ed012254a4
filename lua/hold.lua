-- Holds a key: no request of it goes, in any process, before the hold ends.
-- A hold pauses the key; it does not spend its limits: when it ends, each
-- bucket has the tokens it had, and those it refilled meanwhile, and each
-- window its room. A hold never shortens one that already reaches further.
-- Every booking reads it (reserve.lua, quota.lua), and so does a sync
-- (sync.lua), which takes no reading across it for others' spending.
--
-- KEYS[1]  the key's hold: when its latest hold ends, which a process that
--          may have missed the hold's message reads too (held.lua); kept a
--          minute after, as long as a steered bucket at least, whose next
--          reading must know of it
-- ARGV[1]  the hold, in microseconds from now
-- ARGV[2]  the Pub/Sub channel that tells the fleet of holds
-- ARGV[3]  the key, as the fleet names it
--
-- It publishes "KEY\nEND LENGTH": when the hold ends (Redis's clock) and how
-- long it is, in microseconds. Returns {changed (1 or 0), now, the end of
-- the hold before it (0 for none)}: a refusal's weight looks back at it
-- (see refused.lua).
local hold_end = now + tonumber(ARGV[1])
local held = time(1, read(1, 'GET'))
if held and held >= hold_end then
  return {0, now, held}
end
redis.call('SET', KEYS[1], string.format('%d', hold_end), 'PXAT', ms_expiry(hold_end + 60000000))

-- Callers already booked and asleep hear of the hold and book anew.
redis.call('PUBLISH', ARGV[2], ARGV[3] .. '\n' .. string.format('%d', hold_end) .. ' ' .. ARGV[1])
return {1, now, held or 0}
