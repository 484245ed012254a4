-- Spaces the turns of a key's deferred requests: those whose class kept
-- them out of the schedule, since their wait would have passed its horizon
-- (see Class). Each books at its turn: when its wait comes within the
-- horizon, or, behind the requests deferred before it, once their turns have
-- passed. So they book one after another, in the order they were deferred,
-- rather than all at once.
--
-- KEYS[1]  the line: when the last turn ends, in microseconds of Redis's clock
-- ARGV[1]  earliest: microseconds from now when the caller's wait comes
--          within its horizon
-- ARGV[2]  the caller's turn: microseconds its cost takes to refill
--
-- Returns {now, the caller's turn in microseconds from now}.
local last = number(1, read(1, 'GET'), now + horizon) or 0
local turn = math.max(now + tonumber(ARGV[1]), last)
local ends = turn + tonumber(ARGV[2])
redis.call('SET', KEYS[1], string.format('%d', ends), 'PXAT', ms_expiry(ends))
return {now, turn - now}
