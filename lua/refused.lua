-- Takes what became of a request whose response no counters explain: the
-- upstream refused it (a 429 or 503, with a Retry-After or without), or
-- served it while the key's rate listens for a success
-- (see internal/steer/rate.go for the controller, and rate.lua).
--
-- The first refusal opens the key's rate, cuts nothing, and wakes the
-- requests booked until now, asleep in any process: they give their
-- bookings back and book anew, evenly (the fleet hears "KEY\nrate NOW" on
-- the channel of holds). A refusal of a request booked before the last cut
-- does not cut again: it is weighed with the next, unless they storm (see
-- rate_storm; as many booked before the rate opened as its buckets' burst
-- weigh nothing: they went in a burst the limits allow). Any
-- other cuts the rate by its weight, the share refused of the requests
-- gone since the last refusal weighed (booked, and no longer held by the
-- rate's bucket) and this one, or, for one that brought a hold after a
-- hold since the last cut ended, the share the upstream's burst was of
-- what went since (see rate_held_weight), half at most; a cut of an eighth
-- or more wakes the sleepers too. A success of a request booked since the
-- last cut says that the upstream accepts again: a later cut may lower the
-- edge.
--
-- KEYS[1]  the key's rate; KEYS[2] the key's hold (see hold.lua)
-- ARGV[1]  "refused" or "served"
-- ARGV[2]  when the request was booked, in microseconds of Redis's clock
-- ARGV[3]  the Pub/Sub channel of holds; ARGV[4] the key, as the fleet names it
-- ARGV[5]  the smallest burst of the quota's buckets, 0 for none (see internal/steer's Rate.Refused)
-- ARGV[6]  for a refusal that brought a hold of the key, when the hold
--          before it ended, in microseconds of Redis's clock; else 0
--
-- Returns {now, share}: the share of its configured rate the key goes at
-- after a cut, in parts per million; 0 when nothing was cut.

-- wake_sleepers tells the fleet that the key's rate opened or was cut
-- deep enough: the requests asleep in their bookings book anew.
local function wake_sleepers()
  redis.call('PUBLISH', ARGV[3], ARGV[4] .. '\nrate ' .. string.format('%d', now))
end

local r = read_rate(1, time(2, read(2, 'GET')))
local decided, burst = tonumber(ARGV[2]), tonumber(ARGV[5])
if ARGV[1] == 'served' then
  if r and decided >= r.cut and not r.heard then
    r.heard = true
    write_rate(KEYS[1], r)
  end
  return {now, 0}
end
if not r then
  write_rate(KEYS[1], {edge = rate_full, bottom = rate_full, cut = now, heard = false, tat = now, step = 0, booked = 0, gone = 0,
    refused = -burst, sure = false})
  wake_sleepers()
  return {now, 0}
end
if decided < r.cut then
  r.refused = r.refused + 1 -- weighed with the next refusal, unless they storm
  local stormed = rate_storm(r)
  write_rate(KEYS[1], r)
  if not stormed then return {now, 0} end
  wake_sleepers()
  return {now, r.bottom}
end

local gone = rate_gone(r)
local at, current = rate_share(r, decided), rate_share(r, now)
local refused = math.max(r.refused, 0)
local weight = math.floor((refused + 1) * rate_full / (math.max(gone - r.gone, refused) + 1))
local before = tonumber(ARGV[6])
if before > 0 then weight = math.max(weight, rate_held_weight(r, burst, before)) end
weight = math.min(weight, rate_max_cut)
if r.heard or weight < rate_max_cut then
  local edge = at - math.floor(at * weight / rate_full)
  r.sure = r.heard
  if not r.heard then
    edge = math.min(edge, r.edge)
  elseif decided - r.cut < rate_climb and edge > r.bottom then
    edge = r.bottom + math.floor((edge - r.bottom) / 2) -- the climb went past the upstream's limit
  end
  r.edge = math.max(edge, rate_floor)
end
r.bottom = math.max(math.min(current - math.floor(current * weight / rate_full), r.edge), rate_floor)
r.cut, r.heard, r.refused = now, false, 0
local wake = current - r.bottom >= math.floor(current * rate_wake_cut / rate_full)
if wake then
  r.tat = now -- the sleepers book anew from now, counted anew
end
r.gone = rate_gone(r)
write_rate(KEYS[1], r)
if wake then
  wake_sleepers()
end
return {now, r.bottom}
