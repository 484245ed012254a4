-- Reads when the latest hold of a key ends, for a process that may have
-- missed the hold's message (its subscription was down).
--
-- KEYS[1]  the key's hold (see hold.lua)
--
-- Returns the hold's end, in microseconds of Redis's clock, or 0.
return time(1, read(1, 'GET')) or 0
