-- The start of every script, prepended at init after the lines that set
-- horizon and max_refill: Redis's clock, the reads that tell pace's own
-- data at a key from foreign data, and the expiry formulas.
--
-- horizon is the furthest ahead of now that a time pace writes can lie: the
-- longest wait a limiter books (MaxDelay) and the longest refill (a year,
-- max_refill), in microseconds. A time further ahead, a value that is not a
-- whole number (or beyond 2^53, where Lua's numbers stop being exact), or a
-- key of another type than pace writes there is foreign: the script
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

-- any_exists reports whether any of KEYS[i], KEYS[j] and KEYS[k] is
-- there: one command, where reading keys that are seldom there (a hold, a
-- call's record) would take one each.
local function any_exists(i, j, k)
  return redis.call('EXISTS', KEYS[i], KEYS[j], KEYS[k]) > 0
end

-- number is the number that text, read at KEYS[i], stands for (nil for
-- no text): a whole number from 0 (or at_least, when given) to at_most,
-- else foreign. Whatever the form of the text (Lua reads "0x10" and "1e3"
-- too), what passes can neither overflow nor move a schedule beyond what
-- pace books.
local function number(i, text, at_most, at_least)
  if not text then return nil end
  local n = tonumber(text)
  if not n or n ~= n or n % 1 ~= 0 or (n < 0 and not at_least) then
    foreign(i, 'holds a value that is not a whole number')
  end
  if n > at_most or n < (at_least or 0) then
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

-- window_at returns the fixed window that holds t: when it starts, when
-- the next starts, and its field in the window's counts (a hash). spec is
-- the windows' length, or, for windows of unequal lengths (a calendar's
-- days or months), the times they start at, ascending and comma-separated,
-- the last being the end of the one before; then a t outside them returns
-- nil. All in microseconds; a window of a length is numbered from the Unix
-- epoch, one of a calendar by its start.
local function window_at(spec, t)
  local a = tonumber(spec)
  if a then
    local w = (t - t % a) / a
    return w * a, (w + 1) * a, string.format('%d', w)
  end
  local start
  for text in string.gmatch(spec, '%d+') do
    local b = tonumber(text)
    if b > t then
      if not start then return nil end
      return start, b, string.format('%d', start)
    end
    start = b
  end
  return nil
end

-- A bucket's value is its schedule, the theoretical arrival time (TAT), or,
-- once the upstream's counters have steered it, twelve whole numbers,
-- "TAT SEEN TILL SPREAD LEARNED LEFT BASE SYNCED BOOKED FOREIGN ORDER CEILING":
--   SEEN     the due time of the request whose response steered it last (0
--            after the first)
--   TILL     until when the units a window has left are spread (0: none)
--   SPREAD   how far apart they go, in microseconds (0: none are left)
--   LEARNED  the interval the upstream advertised (0: none)
--   LEFT     the units that response said were left, less those booked
--            after its request (below 0 when more were)
--   BASE     the count of units booked (BOOKED) after that request
--   SYNCED   the count of units booked (BOOKED) then: a response to a
--            request booked before it is stale
--   BOOKED   the units booked since the bucket was first steered: a
--            booking's count after it tells the units booked after it
--   FOREIGN  an estimate of the rate at which others spend the quota, in
--            units per 10^6 s (below 0 when the fleet's own bookings
--            overstate what it spent), as the last reading implied it (a
--            window's spread takes the lower of it and the one before: see
--            estimate_foreign in sync.lua)
--   ORDER    the next free time before the schedule last moved back: a
--            request booked since but due before it went out of order
--   CEILING  the schedule of the bucket alone, at the upstream's interval
--            (the learned one, or the configured), which only the units
--            the fleet is known to spend move: the costs it books, except
--            a reservation's estimates (see estimated), and what
--            settlements say; no reading moves the TAT before it, so that
--            no reading lets the fleet beyond the bucket's own b + r*t, but
--            a reading may give back what an estimate booked beyond what
--            its request spent
-- A steered bucket is kept for a minute after its last steering at least.

-- read_bucket reads the bucket at KEYS[i]: its TAT and its steering (nil
-- when none), or nothing for an empty key.
local function read_bucket(i)
  local v = read(i, 'GET')
  if not v or not string.find(v, ' ', 1, true) then
    return time(i, v), nil
  end
  local f = {}
  for field in string.gmatch(v, '%S+') do f[#f + 1] = field end
  if #f ~= 12 then
    foreign(i, 'holds a value that is not a whole number')
  end
  return time(i, f[1]), {seen = time(i, f[2]), till = time(i, f[3]), spread = number(i, f[4], horizon),
    learned = number(i, f[5], horizon), left = number(i, f[6], 2^53, -2^53), base = number(i, f[7], 2^53),
    synced = number(i, f[8], 2^53), booked = number(i, f[9], 2^53), foreign = number(i, f[10], 1e15, -1e15),
    order = time(i, f[11]), ceiling = time(i, f[12])}
end

-- write_bucket sets the bucket at key to the TAT and steering given.
local function write_bucket(key, tat, steer)
  if not steer then
    redis.call('SET', key, string.format('%d', tat), 'PXAT', full_expiry(tat))
    return
  end
  if steer.till <= now then
    steer.till, steer.spread = 0, 0
  end
  local value = string.format('%d %d %d %d %d %d %d %d %d %d %d %d', tat, steer.seen, steer.till, steer.spread,
    steer.learned, steer.left, steer.base, steer.synced, steer.booked, steer.foreign, steer.order, steer.ceiling)
  redis.call('SET', key, value, 'PXAT', math.max(full_expiry(tat), ms_expiry(steer.till), ms_expiry(now + 60000000)))
end

-- moved_back notes that a steered bucket's next free time moved back from
-- free: bookings to come may go before some made already (see ORDER).
local function moved_back(steer, free)
  if steer then
    steer.order = math.max(steer.order, free)
  end
end

-- count_booked adds units (fewer, when negative) to a steered bucket's
-- count of units booked, and returns the count (0 for a bucket not
-- steered).
local function count_booked(steer, units)
  if not steer then return 0 end
  steer.booked = math.max(math.min(steer.booked + units, 2^53), 0)
  return steer.booked
end

-- interval is the upstream's interval for a bucket of configured interval
-- a: the learned one, if any.
local function interval(steer, a)
  if steer and steer.learned > 0 then return steer.learned end
  return a
end

-- estimated reports whether limit i's cost is an estimate in mask, the set
-- of a reservation's estimated limits (bit i - 1 for limit i): a cost the
-- upstream's counters may correct until it is settled.
local function estimated(mask, i)
  return math.floor(mask / 2 ^ (i - 1)) % 2 == 1
end

-- known is the units of cost under limit i that the fleet is known to
-- spend, as a booking with the estimates mask books them: none of an
-- estimate.
local function known(mask, i, cost)
  if estimated(mask, i) then return 0 end
  return cost
end

-- move_ceiling moves a steered bucket's CEILING as units (fewer, when
-- negative: a settlement's credit) booked at due move the bucket alone:
-- from due, or its CEILING if later, never before now.
local function move_ceiling(steer, a, units, due)
  if steer then
    steer.ceiling = math.min(math.max(math.max(steer.ceiling, due) + units * interval(steer, a), now), now + horizon)
  end
end

-- fleet_interval is the interval the fleet books a bucket of burst b at:
-- the upstream's, slowed by the share others spend, 90% of it at most (a
-- window read as a quota that refills refills nothing until its reset, and
-- seems spent by others in full: slowed a hundredfold, the fleet's queue
-- outlasted the window, and the readings of its requests, booked before
-- the last one applied, were stale until it drained; a refusal steers a
-- fleet that others leave less), and never so slow that the burst would
-- take more than a year to refill, so that no schedule can reach beyond
-- the horizon.
local function fleet_interval(steer, a, b)
  local i = interval(steer, a)
  if not steer or steer.foreign <= 0 then return i end
  i = math.ceil(i / (1 - math.min(steer.foreign * i / 1e12, 0.9)))
  return math.min(i, math.max(interval(steer, a), math.floor(max_refill / b)))
end

-- bucket_step returns, for a booking at due, the TAT a bucket books from,
-- the microseconds a unit takes, whether its units are spread, and the
-- time no booking goes before (0: none): while a window's units are spread
-- and some are left before its reset, one at a time, at the spread, from
-- the TAT; once none are left, not before the reset, with the burst the
-- bucket has then, as after a hold; else at the fleet's interval, as the
-- burst allows.
local function bucket_step(tat, steer, a, b, due)
  local i = fleet_interval(steer, a, b)
  if steer and steer.till > now then
    if steer.spread > 0 and math.max(tat or due, due) < steer.till then
      return tat, math.max(steer.spread, i), true, 0
    end
    return tat, i, false, steer.till
  end
  return tat, i, false, 0
end

-- bucket_allow is the earliest time a bucket allows cost units for a
-- request that cannot go before arrival; a steered one, never before its
-- CEILING allows them: whatever a reading said, the bucket alone bounds
-- the fleet (b + r*t), a window's spread and the burst at its reset too.
local function bucket_allow(tat, steer, a, b, cost, arrival)
  if cost == 0 and not steer then return arrival end -- nothing to take, whatever emptied left
  local base, i, spread, after = bucket_step(tat, steer, a, b, arrival)
  local t = arrival
  if base and base > t then t = base end
  if not spread then t = math.max(t + cost * i - b * i, after) end
  if steer then t = math.max(t, steer.ceiling + (cost - b) * interval(steer, a)) end
  return t
end

-- emptied is a bucket's TAT finish after a booking that goes at once, at
-- due: an interval later (a tenth of a second at most) when it left a
-- bucket of a burst (2 units or more) without a unit. The turns after a
-- burst resume that late, so that a burst that reaches the upstream late
-- (the first requests of a fleet open their connections; processes and the
-- network bunch and spread arrivals, by milliseconds to tens of them) does
-- not make the turns after it early at an upstream of the same limit,
-- which would refuse them. It costs at most one unit per burst spent; a
-- fleet that waits its turns never pays it. Local (one process) does not:
-- its turns leave one process, not a fleet.
local resume_late = 100000
local function emptied(finish, a, b, due)
  if b >= 2 and finish > due + (b - 1) * a then return finish + math.min(a, resume_late) end
  return finish
end

-- bucket_finish is a bucket's TAT after cost units booked at due; free
-- when the booking goes at once (see emptied: a booking a schedule holds,
-- a rate's or a hold's, does not empty a burst; a steered bucket follows
-- the upstream's counters instead).
local function bucket_finish(tat, steer, a, b, cost, due, free)
  local base, i = bucket_step(tat, steer, a, b, due)
  if not base or base < due then base = due end
  if steer or not free or cost == 0 then return base + cost * i end
  return emptied(base + cost * i, i, b, due)
end

-- book_bucket writes the bucket at KEYS[i], read as stored and steer, with
-- finish, its TAT after cost units of interval a booked at due (known: the
-- units the fleet is known to spend, see known), and returns a steered
-- bucket's count of units booked after it (0 for one not steered). While
-- the TAT of a bucket not steered stays within one second, the expiry
-- stands, and KEEPTTL spares Redis the cost of setting it anew on every
-- booking.
local function book_bucket(i, stored, steer, a, finish, cost, known_units, due)
  if not steer and stored and stored - stored % 1000000 == finish - finish % 1000000 then
    redis.call('SET', KEYS[i], string.format('%d', finish), 'KEEPTTL')
    return 0
  end
  local booked = count_booked(steer, cost)
  move_ceiling(steer, a, known_units, due)
  write_bucket(KEYS[i], finish, steer)
  return booked
end
