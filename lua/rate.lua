-- Follows common.lua in the scripts that book (reserve.lua, quota.lua) and
-- in refused.lua: a key's rate after refusals the upstream gave without
-- saying why (see internal/steer, whose Rate is the same in Go). It is kept
-- at the key's #rate as ten whole numbers, "EDGE BOTTOM CUT HEARD TAT STEP
-- BOOKED GONE REFUSED SURE": the rate the upstream was found to accept and
-- the rate the last cut left, in parts per million of the configured rate;
-- when the last refusal was weighed (or opened the rate); 1 once a request
-- booked since succeeded, else 0; the schedule of the rate's bucket, and
-- what the last request booked added to it; the requests booked since the
-- rate opened, and of them those gone when the last refusal was weighed;
-- the refusals heard since that wait for the next, of requests booked
-- before it or among few near the edge (less the burst until the first
-- cut); and 1 when the edge was set after a success, else 0. A rate is
-- read with the key's hold (HOLD, when its latest hold ends, 0 for none:
-- see hold.lua): a key held since its last cut is probed four times
-- slower, since a refusal there would likely hold it again. Every step
-- below is exact in Lua's numbers, so that Go agrees.
local rate_full, rate_max_cut, rate_wake_cut, rate_floor = 1000000, 500000, 125000, 10000
local rate_climb, rate_probe, rate_guess, rate_quiet, rate_held_probe = 500000, 10000000, 4000000, 5000000, 4
local rate_storm_refusals = 2

-- read_rate reads the key's rate at KEYS[i], with the key's hold (see
-- above): nil when there is none. A rate of five numbers, as pace wrote it
-- before it weighed refusals, has counted none.
local function read_rate(i, hold)
  local v = read(i, 'GET')
  if not v then return nil end
  local f = {}
  for field in string.gmatch(v, '%S+') do f[#f + 1] = field end
  if #f ~= 5 and #f ~= 10 then
    foreign(i, 'holds a value that is not a whole number')
  end
  return {edge = number(i, f[1], rate_full, 1), bottom = number(i, f[2], rate_full, 1), cut = time(i, f[3]),
    heard = number(i, f[4], 1) == 1, tat = time(i, f[5]), step = number(i, f[6] or '0', max_refill),
    booked = number(i, f[7] or '0', 2^53), gone = number(i, f[8] or '0', 2^53), refused = number(i, f[9] or '0', 2^53, -2^53),
    sure = number(i, f[10] or '0', 1) == 1, hold = hold or 0}
end

-- rate_expiry is when r is gone at the latest: back at the configured rate,
-- its bucket's schedule over.
local function rate_expiry(r)
  return math.max(r.cut + rate_climb + 5 * rate_probe, r.tat)
end

-- write_rate sets the key's rate at key to r, until its expiry.
local function write_rate(key, r)
  local heard, sure = 0, 0
  if r.heard then heard = 1 end
  if r.sure then sure = 1 end
  redis.call('SET', key, string.format('%d %d %d %d %d %d %d %d %d %d', r.edge, r.bottom, r.cut, heard, r.tat, r.step, r.booked, r.gone,
    r.refused, sure),
    'PXAT', ms_expiry(rate_expiry(r)))
end

-- cube is v*(x/y)^3, rounded down at each of three steps.
local function cube(v, x, y)
  for _ = 1, 3 do v = math.floor(v * x / y) end
  return v
end

-- rate_share is the share of the configured rate the key goes at, at t,
-- under r: the climb from the cut to the edge, then the probe, slower for
-- a key held since the cut.
local function rate_share(r, t)
  if not r then return rate_full end
  local s = t - r.cut
  if s < rate_climb then
    return math.min(r.edge - cube(r.edge - r.bottom, rate_climb - s, rate_climb), rate_full)
  end
  local p = rate_guess
  if r.sure then p = rate_probe end
  if r.hold > r.cut then p = p * rate_held_probe end
  return math.min(r.edge + cube(r.edge, math.min(s - rate_climb, 5 * p), p), rate_full)
end

-- rate_recovered reports whether r is gone at t, to be dropped: back at
-- the configured rate, quiet after its last refusal, and nothing booked
-- ahead (a fleet that waits its turns keeps it: the limits' burst returns
-- once the key is quiet); or at its expiry.
local function rate_recovered(r, t)
  return t >= rate_expiry(r) or rate_share(r, t) >= rate_full and t - r.cut >= rate_quiet and t >= r.tat
end

-- rate_interval is the time r's bucket takes, at share s, for a request
-- that takes unit µs at the configured rate: a year at most.
local function rate_interval(unit, s)
  return math.min(math.ceil(unit * rate_full / s), max_refill)
end

-- rate_allow is the earliest time, at or after at, that r lets a request
-- that takes unit µs go: r's bucket has no burst, and during the climb the
-- first request after the cut waits an interval.
local function rate_allow(r, at, unit)
  if unit <= 0 then return at end
  local tat = r.tat
  if now - r.cut < rate_climb then
    tat = math.max(tat, r.cut + rate_interval(unit, rate_share(r, now)))
  end
  return math.max(at, tat)
end

-- rate_book books a request that takes unit µs at due in r's bucket, and
-- counts it, unless again: a request booked anew, whose booking a hold or
-- a retime displaced, is one request, which its first booking counted.
local function rate_book(r, due, unit, again)
  if unit <= 0 then return end
  if not again then r.booked = r.booked + 1 end
  r.step = rate_interval(unit, rate_share(r, now))
  r.tat = math.max(r.tat, due) + r.step
end

-- rate_booked books a request at due in r (see rate_book) and writes r
-- back to KEYS[i].
local function rate_booked(r, i, due, unit, again)
  rate_book(r, due, unit, again)
  write_rate(KEYS[i], r)
end

-- rate_held_weight is the least weight of a refusal that brought a hold,
-- at now, after a hold that came since r's last cut and ended at before:
-- the upstream's bucket was full then, so of what the fleet sent since at
-- its rate, the burst and one more went unpaid (at least: more, and the
-- fleet went further above the upstream's rate). 0 when there was no such
-- hold.
local function rate_held_weight(r, burst, before)
  if before <= r.cut or before >= now or r.step <= 0 then return 0 end
  local unpaid = (burst + 1) * r.step
  if 2 * unpaid >= now - before then return rate_max_cut end
  return math.floor(unpaid * rate_full / (now - before))
end

-- rate_kept is how much of a bucket's schedule ahead of now a refusal
-- that woke the sleepers (wake) or cut the rate (cut) keeps (see
-- refused.lua's trim_queues), for a bucket whose burst takes burst µs to
-- refill, of a bucket the upstream's counters steer (steered): see
-- internal/steer's Kept.
local rate_keep, rate_keep_smaller = 1000000, 100000
local function rate_kept(burst, wake, cut, steered)
  if steered or wake and cut then return math.max(burst, rate_keep) end
  if wake then return math.min(2 * burst, math.max(burst, rate_keep)) end
  return math.max(burst, rate_keep_smaller)
end

-- rate_gone is how many of the requests booked have gone by now: all but
-- those due after now, which r's bucket holds (the last one due ends its
-- schedule a step later).
local function rate_gone(r)
  if r.tat <= now + r.step or r.step <= 0 then return r.booked end
  return math.max(r.booked - math.ceil((r.tat - now) / r.step) + 1, 0)
end

-- rate_storm cuts r to half its edge, and reports whether it did, when
-- the refusals of requests booked before its last cut are
-- rate_storm_refusals or more, and three in four or more of the requests
-- gone since it: the cut was too small, and an upstream that refuses
-- nearly all while over its limit (HAProxy counts its refusals) would
-- refuse each request still asleep in its booking at the old rate. The
-- sleepers wake; the edge stays, and a storm never takes the rate below
-- half of it. The opening is no cut, and a held key has no storm (see
-- internal/steer's Rate.storm).
local function rate_storm(r)
  local half, current = math.max(math.floor(r.edge / 2), rate_floor), rate_share(r, now)
  local few = r.refused < rate_storm_refusals or 4 * r.refused < 3 * (rate_gone(r) - r.gone)
  if r.bottom == rate_full or r.hold > now or few or current - half < math.floor(current * rate_wake_cut / rate_full) then
    return false
  end
  r.bottom = half
  r.cut, r.heard, r.refused, r.tat = now, false, 0, now
  r.gone = rate_gone(r)
  return true
end
