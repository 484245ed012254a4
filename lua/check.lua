-- Answers a limiter's Check: that Redis runs pace's scripts (their common
-- prelude included) on this connection. It reads no key and writes none.
--
-- Returns Redis's clock, in microseconds.
return now
