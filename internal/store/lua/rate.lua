-- Follows common.lua in the scripts that book (reserve.lua, quota.lua) and
-- in refused.lua: a key's rate after refusals the upstream gave without
-- saying why (see internal/steer, whose Rate is the same in Go). It is kept
-- at the key's #rate as five whole numbers, "EDGE BOTTOM CUT HEARD TAT": the
-- rate at which the upstream refused and the rate the last cut left, in
-- parts per million of the configured rate; when the last cut was; 1 once a
-- request booked since succeeded, else 0; and the schedule of the rate's
-- bucket. Every step below is exact in Lua's numbers, so that Go agrees.
local rate_full, rate_cut, rate_keep, rate_margin, rate_floor = 1000000, 700000, 700000, 30000, 10000
local rate_climb, rate_probe, rate_burst = 500000, 3700000, 50000

-- read_rate reads the key's rate at KEYS[i]: nil when there is none.
local function read_rate(i)
  local v = read(i, 'GET')
  if not v then return nil end
  local f = {}
  for field in string.gmatch(v, '%S+') do f[#f + 1] = field end
  if #f ~= 5 then
    foreign(i, 'holds a value that is not a whole number')
  end
  return {edge = number(i, f[1], rate_full, 1), bottom = number(i, f[2], rate_full, 1), cut = time(i, f[3]),
    heard = number(i, f[4], 1) == 1, tat = time(i, f[5])}
end

-- write_rate sets the key's rate at key to r, until it is back at the
-- configured rate (or its bucket's schedule ends, if later).
local function write_rate(key, r)
  local heard = 0
  if r.heard then heard = 1 end
  redis.call('SET', key, string.format('%d %d %d %d %d', r.edge, r.bottom, r.cut, heard, r.tat),
    'PXAT', ms_expiry(math.max(r.cut + rate_climb + 5 * rate_probe, r.tat)))
end

-- cube is v*(x/y)^3, rounded down at each of three steps.
local function cube(v, x, y)
  for _ = 1, 3 do v = math.floor(v * x / y) end
  return v
end

-- rate_share is the share of the configured rate the key goes at, at t,
-- under r: the climb from the cut to 3% below the edge, then the probe.
local function rate_share(r, t)
  if not r then return rate_full end
  local top = r.edge - math.floor(r.edge * rate_margin / rate_full)
  local s = t - r.cut
  if s < rate_climb then
    return math.min(top - cube(top - r.bottom, rate_climb - s, rate_climb), rate_full)
  end
  return math.min(top + cube(top, math.min(s - rate_climb, 5 * rate_probe), rate_probe), rate_full)
end

-- rate_interval is the time r's bucket takes, at share s, for a request
-- that takes unit µs at the configured rate: a year at most.
local function rate_interval(unit, s)
  return math.min(math.ceil(unit * rate_full / s), max_refill)
end

-- rate_allow is the earliest time, at or after at, that r lets a request
-- that takes unit µs go; burst is the time the quota's fastest limit takes
-- to refill its burst. During the climb there is no burst, and the first
-- request after the cut waits an interval.
local function rate_allow(r, at, unit, burst)
  local s = rate_share(r, now)
  if s >= rate_full or unit <= 0 then return at end
  local i = rate_interval(unit, s)
  local tat, b = r.tat, math.max(i, math.min(math.ceil(burst * rate_full / s), rate_burst))
  if now - r.cut < rate_climb then
    tat, b = math.max(tat, r.cut + i), i
  end
  return math.max(at, tat + i - b)
end

-- rate_book books a request that takes unit µs at due in r's bucket.
local function rate_book(r, due, unit)
  local s = rate_share(r, now)
  if s < rate_full and unit > 0 then
    r.tat = math.max(r.tat, due) + rate_interval(unit, s)
  end
end
