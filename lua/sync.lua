-- Steers buckets by what a response said of the upstream's quotas: for each,
-- how many units are left, and when the window resets or (a quota that
-- refills) the quota is full again.
--
-- The units the fleet booked after the request of the response are taken
-- off what is left: the upstream had not counted them. What is left beyond
-- that, less what the fleet's own bookings explain since the last reading,
-- others spent: the bucket keeps an estimate of their rate (an average over
-- about half a second), and the fleet books at the upstream's rate less
-- theirs, leaving them what they spend over the next 50 ms, or, for a
-- window, until its reset. A quota that refills sets the bucket's level to
-- what is left for the fleet (with what it refilled since the request
-- went), when that is lower (no reading refills the bucket: the
-- configured limit is a ceiling), and the bucket then refills
-- at the fleet's interval; a window's units left for the fleet are spread
-- evenly until the earliest it may reset (a reset said in whole seconds is
-- rounded up: spread until it, the units of the rounding's time were never
-- sent). A window's reset a second away or less, said in
-- whole seconds (a level alone), may be a token bucket's time until it is
-- full: the reading sets the level, as a quota's that refills, and tells no
-- rate of others (a window read as refilling seems spent by others; a
-- bucket read as a window spreads a few units over a second). An
-- advertised limit may be learned: its interval, which the limiter has
-- bounded, replaces the bucket's.
--
-- A reading applies only if its request was booked after the last reading
-- was applied, and in order (see ORDER in common.lua): an older reading,
-- come late, never loosens what a newer one set, readings from many
-- processes converge, and the units the upstream had not counted are those
-- booked after the request. Only a slower limit advertised is
-- learned from a stale reading too. When the limit learned changes, the
-- requests booked ahead book anew, at the new pace (see retime).
--
-- KEYS[i]   a bucket (see reserve.lua and common.lua), for i = 1 .. #KEYS - 1
-- KEYS[#KEYS]  the key's hold (see hold.lua): across a hold, the upstream's
--           quota filled up, and the refills it lost are nobody's spending:
--           a reading whose last one's request went before the hold ended
--           is a baseline only
-- ARGV[1]   the Pub/Sub channel of holds; ARGV[2] the key, as the fleet
--           names it (see hold.lua); ARGV[3] 1 when the upstream refused
--           the request (a 429), else 0
-- ARGV[13i-9], ..., ARGV[13i+3]   for bucket i: its configured interval
--           and burst; the bucket's TAT and count of units booked after the
--           request's booking (see reserve.lua), the request's due time,
--           whether it went without waiting (1) or not (0), and its cost
--           under the bucket; the units left, the microseconds until the
--           reset or refill and how many sooner it may come, whether the
--           quota refills (1), is a window (0), a level alone (2) or a
--           bucket's level alone (3: see refills in redis_steer.go); and the
--           interval advertised, or 0 when not learning; and the quota's
--           size, as the reading states its limit (0: it does not)
--
-- Returns {now, result_1, ..., result_n, synced_1, ..., synced_n}: 0 when
-- the reading was stale, 1 when it was applied, 2 when it was applied and
-- changed the interval learned; and each bucket's SYNCED (0 when not
-- steered), by which a process can tell stale readings without asking.
local tau = 500000 -- the time constant of the estimate of others' rate
local probe = 1000000 -- the fleet's interval while others seem to spend all of a window
local held = time(#KEYS, read(#KEYS, 'GET')) or 0

-- since is how many units the upstream had not counted of a bucket stored
-- as tat and steer when it counted a request of cost units, booked with
-- booked units counted (0: not steered then), at due, leaving the bucket
-- at finish: those booked after it. Before the bucket was steered, a
-- request that went without waiting (burst) may have gone with others of
-- its burst, booked before it (after due, on the schedule), that arrived
-- after it: they count too.
local function since(tat, steer, a, finish, booked, due, burst, cost)
  if steer then
    return math.max(steer.booked - booked, 0)
  end
  local n = 0
  if tat and tat > finish then n = math.ceil((tat - finish) / a) end
  if burst then n = n + math.max(math.ceil((finish - cost * a - due) / a), 0) end
  return n
end

-- full reports whether the quota of reading r was full when its request
-- came: what it left and the request's cost make the limit it states.
local function full(r)
  return r.size > 0 and r.left + r.cost >= r.size
end

-- fade lowers the estimate of others' rate, for dt µs of a reading that
-- found the quota full, or full again before the fleet's next turn: over
-- tau, by a fifth at most, and by no more than b units in tau, so that
-- what the fleet then sends more in tau is no more than the burst b, which
-- the upstream's full bucket holds. Others who stopped leave the quota
-- full at the fleet's rate less theirs, and no such reading tells whether
-- they still spend (its refills are lost), so the fleet stayed at that
-- rate: 112/s to 121/s of a quota of 200/s 2 s after others spending half
-- of it stopped, on real processes. Faded, the fleet sends a few units
-- more; if others still spend, the quota is no longer full, and the next
-- reading raises the estimate again (a fleet configured at twice a quota
-- of 400/s burst 4, whose estimate holds the difference, reads it full at
-- that rate too: faded without the burst's bound, it was refused 35 times
-- in 2 s, where it was not).
local function fade(steer, b, dt)
  local f = math.max(math.floor(steer.foreign - math.min(b * 1e12 / tau, steer.foreign / 5) * dt / tau), 0)
  steer.foreign, steer.believed = f, f
end

-- estimate_foreign updates the estimate of others' rate by what they spent
-- from the last reading's request to this one's at due: what the last
-- reading left, refilled meanwhile, less the fleet's bookings since, less
-- what is left now. It tells only while the fleet waits for its turns, as
-- both requests did: the quota, in use all along, never filled up (and
-- refills were not lost). A quota that refills and, by reading r, was
-- full when its request came (what it left and the request's cost make
-- its size), or is full again before the fleet's next turn (its reset is
-- sooner than the fleet's interval), fills up between the fleet's turns:
-- it may lower the estimate, never raise it (the sum counts the refills
-- lost while it was full: under pace's limit at half a bucket of 200/s in
-- OpenAI's fields, others seemed to spend 92/s of the fleet's 100/s, the
-- fleet slowed for it and lost more, 20% served in the simulator, 47% on
-- real processes, where the limit stated is a minute's worth, no size);
-- it fades it (see fade). A
-- window's count of a window that has reset since tells nothing either,
-- nor does a reading with no baseline (SEEN 0: the first reading, or one
-- of a request that did not wait, whose burst may have arrived in any
-- order).
--
-- A window's spread believes the rate a reading implies (FOREIGN) only as
-- far as the reading before it implied it too (BELIEVED, the lower of the
-- two, kept for the call alone; the bucket's value keeps its form): a
-- request that arrived before one booked earlier is counted by the
-- upstream in one reading and by the fleet's bookings in the next, a unit
-- unexplained and then one too many, which is noise, not others. Spread
-- over a window's time left, one such unit taken as a rate would slow the
-- fleet for the whole window. A quota that refills believes each at once:
-- it leaves others what they spend in the next 50 ms, where such a unit
-- weighs a unit, and a rate believed late costs 429s.
local function estimate_foreign(steer, a, b, left, r)
  local dt, refills = r.due - steer.seen, r.refills
  if steer.seen == 0 or dt <= 0 or (refills and steer.till > 0) or (not refills and steer.till <= now) then
    return
  end
  local expected = steer.left
  if refills then
    expected = expected + dt / interval(steer, a)
  end
  local units = expected - (steer.booked - steer.synced) - left
  if units > 0 and refills and (full(r) or r.reset < fleet_interval(steer, a, b)) then
    if steer.foreign > 0 then fade(steer, b, dt) end
    return
  end
  -- Over a short span, a few units of jitter in arrivals are a rate of
  -- hundreds a second: they weigh only as much as the span is of tau. A
  -- window's first estimate too (it is spent until the reset: taken at
  -- face value, one reading's jitter could leave the fleet nothing); a
  -- quota that refills takes its first at face value (it is spent over
  -- 50 ms, and each response corrects it: one too low costs 429s).
  local f
  if dt >= tau or (refills and steer.foreign == 0) then
    f = units * 1e12 / dt
  else
    f = steer.foreign - steer.foreign * dt / tau + units * 1e12 / tau
  end
  f = math.max(math.min(math.floor(f), 1e15), -1e15)
  steer.believed = f
  if not refills then steer.believed = math.min(steer.foreign, f) end
  steer.foreign = f
end

-- refill_interval is how often the quota of reading r refills a unit for
-- the fleet: at the fleet's interval, or, when r was full when its request
-- came and says it is full again sooner (it lacks the request's cost
-- alone), at that rate less others'. At the fleet's own, slower, each
-- reading of a quota faster than pace's limit held the fleet back by what
-- the upstream refilled beyond it while the response travelled (pace at
-- half a bucket of 200/s, 4 requests in flight: 78% of its limit served).
-- Not what a quota that was not full lacks of the limit it states: OpenAI
-- states a minute's worth, and spends a smaller burst; nor its cost alone:
-- a level said in whole units lacks less.
local function refill_interval(steer, a, b, r)
  local i = fleet_interval(steer, a, b)
  if r.reset <= 0 or not full(r) then return i end
  local rate = r.cost / r.reset - math.max(steer.foreign, 0) / 1e12
  if rate <= 0 then return i end
  return math.min(i, 1 / rate)
end

-- spend applies reading r's units left (left: less those booked since its
-- request, which cost r.cost) to a bucket stored as tat and steer, until its
-- reset or refill, and returns the bucket's new TAT: a quota that refills
-- gets that level, plus the fleet's share of what it refilled since the
-- request went (see refill_interval; the units booked since, taken off, were
-- counted or are yet to be while it refilled; not for a level alone but a
-- bucket's: it may be a window's last second), less a request's cost for the
-- jitter of arrivals and what others spend in 50 ms (half the burst at most;
-- until their rate is estimated, what the bucket refills in 50 ms: the rest
-- of the burst is the headroom that a pause of the fleet's, or a clump of
-- arrivals, spends before the upstream's bucket is full and its refills are
-- lost), but never before its CEILING (see common.lua), the bucket alone: no
-- reading refills it beyond what the limit itself allows; a level alone holds
-- the bucket no later than its reset, when the quota is full (an hourly
-- quota's bucket, refilled at its rate, would stay low for the hour), and, a
-- bucket's, than the units booked since its request (r.since), which the
-- upstream had not counted, take to refill after it (else a reading that said
-- a bucket is full soon gave back units the fleet had booked already, and
-- drew a refusal; a window's reset does not wait for them); a window's units,
-- less what others spend until its reset, are spread, until the earliest it
-- may come, from free, the next time free after those booked already, or,
-- when the bucket was spreading, from last, the due time of the last unit
-- booked, at the new spread (at the fleet's interval once that time has come;
-- none left before the reset: the schedule stands, held until it). When
-- others seem to spend all the window has left, the fleet still books a unit
-- every probe (or spreads what is left, if slower; the last unit before the
-- reset at most): else, held until the reset, it would never hear that they
-- stopped.
local function spend(tat, free, last, steer, a, b, r, left)
  local others, cost, reset = math.max(steer.believed, 0), r.cost, r.reset
  if r.refills then
    local i = fleet_interval(steer, a, b)
    local spare = math.ceil(50000 / i)
    if steer.foreign ~= 0 then spare = math.ceil(others / 2e7) end
    local mine = left - cost - math.min(spare, math.floor(b / 2))
    if r.refilled then mine = mine + math.floor(math.max(now - r.due, 0) / refill_interval(steer, a, b, r)) end
    local level = now + (b - math.min(mine, b)) * i
    if r.level then level = math.min(level, now + reset + (r.refilled and r.since * i or 0)) end
    steer.till, steer.spread = 0, 0
    return math.max(steer.ceiling, level)
  end
  local mine = left - math.ceil(others * reset / 1e12)
  steer.till, steer.spread = now + reset, 0
  if left <= 0 or free >= steer.till then return tat or now end
  if mine > 0 then
    steer.spread = math.max(math.ceil((steer.till - r.early - free) / mine), 1)
  else
    steer.spread = math.min(math.max(probe, math.ceil((steer.till - free) / left)), steer.till - free)
  end
  if last then return math.max(last + steer.spread, now) end
  return free
end

-- retime voids the bookings made until now of a bucket whose interval
-- learned changed while ahead units were booked to go after now: their
-- callers, asleep in any process, wake and book anew, at the new pace
-- (the fleet hears "KEY\nretime NOW" on the channel of holds).
local function retime(ahead)
  if ahead > 0 then
    redis.call('PUBLISH', ARGV[1], ARGV[2] .. '\nretime ' .. string.format('%d', now))
  end
end

-- queued is how many units of a bucket stored as tat and steer are booked
-- to go after now.
local function queued(tat, steer, a, b)
  if not tat or tat <= now then return 0 end
  local _, unit = bucket_step(tat, steer, a, b, now)
  return math.max(math.ceil((tat - now) / unit) - b, 0)
end

-- refuse accounts for a request the upstream refused (a 429), booked with
-- booked units counted, at cost: it spent nothing. Booked since the last
-- reading, it is not among the fleet's bookings since; booked before, but
-- after that reading's request, that reading's units left were short of it.
local function refuse(steer, booked, cost)
  if booked > steer.synced then
    steer.synced = steer.synced + cost
  elseif booked > steer.base then
    steer.left = steer.left + cost
  end
end

-- reading is what ARGV says of bucket i (see above).
local function reading(i)
  local o = 13 * i - 9
  local kind = ARGV[o + 10]
  return {a = tonumber(ARGV[o]), b = tonumber(ARGV[o + 1]), finish = tonumber(ARGV[o + 2]),
    booked = tonumber(ARGV[o + 3]), due = tonumber(ARGV[o + 4]), burst = ARGV[o + 5] == '1',
    cost = tonumber(ARGV[o + 6]), left = tonumber(ARGV[o + 7]), reset = tonumber(ARGV[o + 8]),
    early = tonumber(ARGV[o + 9]), refills = kind ~= '0', level = kind == '2' or kind == '3', refilled = kind == '1' or kind == '3',
    learned = tonumber(ARGV[o + 11]), size = tonumber(ARGV[o + 12])}
end

-- take_in takes a fresh reading r into the steering of a bucket stored as
-- tat and steer (nil: not steered yet): the estimate of others' rate (none
-- across a hold; a level alone, which tells none, drops the one readings
-- of another kind made, which would slow the fleet for good: a window
-- read as refilling seemed spent by others in full), and the reading as
-- the baseline of the next. It returns the steering and the units left,
-- less those booked after the request.
local function take_in(tat, steer, r)
  local left = r.left - since(tat, steer, r.a, r.finish, r.booked, r.due, r.burst, r.cost)
  local first = not steer
  steer = steer or {seen = 0, till = 0, spread = 0, learned = 0, left = 0, base = 0, synced = 0, booked = 0, foreign = 0, order = 0,
    ceiling = tat or now}
  if r.level then steer.foreign = 0 end
  steer.believed = steer.foreign
  if not first and not r.burst and not r.level and held <= steer.seen then estimate_foreign(steer, r.a, r.b, left, r) end
  steer.seen, steer.left, steer.base, steer.synced = r.due, math.max(left, -2^53), r.booked, steer.booked
  if first or r.burst then steer.seen = 0 end
  return steer, left
end

-- steer_bucket applies reading r, of a request the upstream refused when
-- refused, to bucket i. It returns 0, 1 or 2 (see above) and the bucket's
-- SYNCED.
local function steer_bucket(i, r, refused)
  local a, b = r.a, r.b
  local tat, steer = read_bucket(i)
  -- A level alone of a window the bucket is spreading is one of its last
  -- seconds, spread as the window's; where its reset may be now, its last
  -- second, spread until halfway through the time its reset may come in:
  -- spread at once, its units drew refusals where the window had not
  -- ended; until the reset said, they outlasted one that had, and the queue
  -- they left held the next window back. (Halved in the second before too,
  -- a window of 20 s in GitHub's fields drew a refusal at its end in about
  -- one run in five.)
  if r.level and steer and steer.till > now then
    r.refills, r.level = false, false
    if r.reset <= r.early then r.early = math.floor(r.early / 2) end
  end
  local fresh = not steer or (r.booked > steer.synced and r.due >= steer.order)
  local slower = r.learned > interval(steer, a)
  local _, unit, spreading = bucket_step(tat, steer, a, b, now)
  local waiting = queued(tat, steer, a, b)
  local free = math.max(bucket_allow(tat, steer, a, b, 1, now), now)
  if refused and steer then refuse(steer, r.booked, r.cost) end
  if not fresh and not slower then
    if refused and steer then write_bucket(KEYS[i], tat, steer) end
    return 0, steer and steer.synced or 0
  end
  local old, left, result, ahead = tat, r.left, 1, 0
  if fresh then
    steer, left = take_in(tat, steer, r)
    r.since = math.max(r.left - left, 0)
  end
  if r.learned > 0 and r.learned ~= steer.learned then
    -- The units booked to go after now book anew, at the new pace, and the
    -- bookings to come are not all new: no baseline. The bucket alone
    -- (CEILING) keeps the units not voided, at the new interval.
    local before = interval(steer, a)
    steer.learned, steer.seen, result, ahead = r.learned, 0, 2, waiting
    if steer.ceiling > now then
      steer.ceiling = now + math.max(math.ceil((steer.ceiling - now) / before) - ahead, 0) * r.learned
    end
  end
  if fresh then
    -- The units booked go before free or, while spreading, at last at most:
    -- the bookings to come may go before some of them (see ORDER).
    local last, booked = nil, free - 1
    if spreading and tat and ahead == 0 then last, booked = tat - unit, tat - unit end
    tat = spend(tat, free, last, steer, a, b, r, left + ahead)
    if ahead == 0 and math.max(bucket_allow(tat, steer, a, b, 1, now), now) <= booked then moved_back(steer, free) end
  elseif ahead > 0 then -- an older reading, of a slower limit: the units ahead, at the new pace
    tat = now + math.max(math.ceil((old - now) / unit) - ahead, 0) * fleet_interval(steer, a, b)
  end
  retime(ahead)
  write_bucket(KEYS[i], tat, steer)
  return result, steer.synced
end

local reply = {now}
local n = #KEYS - 1
for i = 1, n do
  reply[i + 1], reply[1 + n + i] = steer_bucket(i, reading(i), ARGV[3] == '1')
end
return reply
