-- Takes what became of a request whose response said nothing of why: the
-- upstream refused it (a 429 or 503 without Retry-After or counters that
-- explain it), or served it while the key's rate listens for a success
-- (see internal/steer/rate.go for the controller, and rate.lua).
--
-- A refusal of a request booked before the last cut changes nothing: the
-- cut reacted to it already. Any other cuts the key's rate, and the
-- requests booked until now, asleep in any process, give their bookings
-- back and book anew at the new rate (the fleet hears "KEY\nrate NOW" on
-- the channel of holds). A success of a request booked since the last cut
-- says that the upstream accepts again: a later refusal may lower the edge.
--
-- KEYS[1]  the key's rate
-- ARGV[1]  "refused" or "served"
-- ARGV[2]  when the request was booked, in microseconds of Redis's clock
-- ARGV[3]  the Pub/Sub channel of holds; ARGV[4] the key, as the fleet names it
--
-- Returns {now, share}: the share of its configured rate the key goes at
-- after a cut, in parts per million; 0 when nothing was cut.
local r = read_rate(1)
local decided = tonumber(ARGV[2])
if ARGV[1] == 'served' then
  if r and decided >= r.cut and not r.heard then
    r.heard = true
    write_rate(KEYS[1], r)
  end
  return {now, 0}
end
if r and decided < r.cut then
  return {now, 0}
end

local at, current = rate_share(r, decided), rate_share(r, now)
if not r then
  r = {edge = at}
elseif r.heard then
  r.edge = math.max(at, math.floor(r.edge * rate_keep / rate_full))
end
r.edge = math.max(r.edge, rate_floor)
local top = r.edge - math.floor(r.edge * rate_margin / rate_full)
r.bottom = math.max(math.min(math.floor(current * rate_cut / rate_full), top), rate_floor)
r.cut, r.heard, r.tat = now, false, now
write_rate(KEYS[1], r)
redis.call('PUBLISH', ARGV[3], ARGV[4] .. '\nrate ' .. string.format('%d', now))
return {now, r.bottom}
