-- Follows common.lua and limits.lua: notes that a limiter paces a key of
-- one bucket at interval ARGV[1] and burst ARGV[2], as its bookings do
-- (see agree in limits.lua), without booking anything: a stricter limit
-- than the one standing holds for the key at once, and the requests booked
-- before it book anew.
--
-- KEYS[1]  the limits the fleet paces the key at
-- KEYS[2]  there while they differ
-- KEYS[3]  the key's bucket (see reserve.lua)
-- ARGV[3]  ARGV[1] and ARGV[2] as the record writes them, "A B "
--
-- Returns the TIME it used, in microseconds.
agree(1, tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3])
if displaced then drop_queue(3, 1) end
return now
