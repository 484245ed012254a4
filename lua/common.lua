-- The start of every script, prepended at init after a line that sets
-- horizon: Redis's clock, the reads that tell pace's own data at a key from
-- foreign data, and the expiry formulas.
--
-- horizon is the furthest ahead of now that a time pace writes can lie: the
-- longest wait a limiter books (MaxDelay) and the longest refill (a year),
-- in microseconds. A time further ahead, a value that is not a whole number
-- (or beyond 2^53, where Lua's numbers stop being exact), or a key of
-- another type than pace writes there is foreign: the script
-- stops with an error that starts with PACEKEY, the index of the key in
-- KEYS and what is wrong there. The limiter returns it to that key's callers
-- alone (a *KeyError); it is not an outage. Every script reads and checks
-- its keys before it writes any, so foreign data leaves them as they were.
local clock = redis.call('TIME')
local now = clock[1] * 1000000 + clock[2]

local function foreign(i, problem)
  error({err = 'PACEKEY ' .. i .. ' ' .. problem})
end

-- read runs a read command on KEYS[i] and returns its reply; a key of
-- another type than the command reads is foreign.
local function read(i, command, ...)
  local reply = redis.pcall(command, KEYS[i], ...)
  if type(reply) == 'table' and reply.err then
    foreign(i, 'holds a ' .. redis.call('TYPE', KEYS[i]).ok .. ', which pace does not write there')
  end
  return reply
end

-- number is the number that text, read at KEYS[i], stands for (nil for
-- no text): a whole number from 0 to at most, else foreign. Whatever the
-- form of the text (Lua reads "0x10" and "1e3" too), what passes can neither
-- overflow nor move a schedule beyond what pace books.
local function number(i, text, at_most)
  if not text then return nil end
  local n = tonumber(text)
  if not n or n ~= n or n < 0 or n % 1 ~= 0 then
    foreign(i, 'holds a value that is not a whole number')
  end
  if n > at_most then
    foreign(i, 'holds a number beyond any pace writes there')
  end
  return n
end

-- time is a time read at KEYS[i]: no further ahead than the horizon.
local function time(i, text)
  return number(i, text, now + horizon)
end

-- full_expiry is the expiry (PXAT) of a bucket whose schedule is t: the end
-- of the second in which the bucket is full again.
local function full_expiry(t)
  return (t - t % 1000000) / 1000 + 1000
end

-- ms_expiry is the expiry (PXAT) of a key that matters until t: the
-- millisecond after it.
local function ms_expiry(t)
  return (t - t % 1000) / 1000 + 1
end

-- guard is what a sliding window of length leaves between a grant and the
-- one that takes its place, so that the jitter between a grant and its
-- arrival upstream does not crowd two into one window: a fiftieth of the
-- window, at most 50 ms.
local function guard(length)
  return math.min(length - length % 50, 2500000) / 50
end
