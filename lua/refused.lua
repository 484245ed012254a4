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
-- what went since (see rate_held_weight), half at most. Near the edge
-- (sure, and heard since the cut), a refusal that weighs no hold among
-- fewer than 8 requests gone since waits: it is weighed with the next
-- (see internal/steer's Rate.waits). A cut of an eighth or more wakes the
-- sleepers too, a smaller one those booked more than a tenth of a second
-- ahead (see trim_queues). A success of a request booked since the last
-- cut says that the upstream accepts again: a later cut may lower the
-- edge.
--
-- KEYS[1]  the key's rate; KEYS[2] the key's hold (see hold.lua)
-- ARGV[1]  "refused" or "served"
-- ARGV[2]  when the request was booked, in microseconds of Redis's clock
-- ARGV[3]  the Pub/Sub channel of holds; ARGV[4] the key, as the fleet names it
-- ARGV[5]  the smallest burst of the quota's buckets, 0 for none (see internal/steer's Rate.Refused)
-- ARGV[6]  for a refusal that brought a hold of the key, when the hold
--          before it ended, in microseconds of Redis's clock; else 0
-- KEYS[2k+1], KEYS[2k+2]  the key's k-th bucket and its gaps (see refund.lua);
-- ARGV[2k+5], ARGV[2k+6]  that bucket's interval and burst
--
-- Returns {now, share}: the share of its configured rate the key goes at
-- after a cut, in parts per million; 0 when nothing was cut.

-- trim_queues takes out of each of the key's buckets the schedule booked
-- beyond rate_kept (see rate.lua; wake: the sleepers wake, cut: the rate
-- was cut; the opening wakes them and cuts nothing), and returns the
-- earliest due time past which a booking is no longer whole in it (the
-- kept TAT less the burst), 0 when it took nothing. A woken sleeper
-- gives its booking back, but one with others behind it stays booked (as
-- a gap, or in a steered bucket), and each would book anew behind its own
-- old booking. A steered bucket's CEILING gives back the same units.
local function trim_queues(wake, cut)
  local after = 0
  for i = 3, #KEYS, 2 do
    local a, b = tonumber(ARGV[i + 4]), tonumber(ARGV[i + 5])
    local tat, steer = read_bucket(i)
    local _, unit = bucket_step(tat, steer, a, b, now)
    local kept = now + rate_kept(b * unit, wake, cut, steer ~= nil)
    if tat and tat > kept then
      if steer and steer.ceiling > now then
        local units = math.floor((tat - kept) / unit)
        steer.ceiling = math.max(steer.ceiling - units * interval(steer, a), now)
      end
      write_bucket(KEYS[i], kept, steer)
      redis.call('ZREMRANGEBYSCORE', KEYS[i + 1], '(' .. string.format('%d', kept), '+inf')
      local whole = kept - b * unit
      if after == 0 or whole < after then after = whole end
    end
  end
  return after
end

-- wake_sleepers tells the fleet that the key's rate opened or was cut
-- (cut) deep enough: the requests asleep in their bookings book anew
-- ("KEY\nrate NOW"), behind what trim_queues keeps.
local function wake_sleepers(cut)
  trim_queues(true, cut)
  redis.call('PUBLISH', ARGV[3], ARGV[4] .. '\nrate ' .. string.format('%d', now))
end

-- wake_queue, after a smaller cut, takes the queue beyond what a wake keeps
-- out of the key's buckets and of r's, and tells the fleet ("KEY\nrate NOW
-- AFTER"): the requests asleep in the bookings due after AFTER give them
-- back and book anew, at the new rate, counted anew. Left booked, a queue
-- seconds deep would go on at the old rate for as long. "KEY\nrate NOW"
-- follows, for the processes of a version that reads no AFTER (a rolling
-- deploy): they wake all their sleepers; the others take it for the same
-- cut (see internal/steer's Retimes).
local function wake_queue(r)
  local after = trim_queues(false, true)
  if after == 0 then return end
  r.tat = math.min(r.tat, after)
  r.gone = rate_gone(r)
  redis.call('PUBLISH', ARGV[3], ARGV[4] .. '\nrate ' .. string.format('%d %d', now, after))
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
  wake_sleepers(false)
  return {now, 0}
end
if decided < r.cut then
  r.refused = r.refused + 1 -- weighed with the next refusal, unless they storm
  local stormed = rate_storm(r)
  write_rate(KEYS[1], r)
  if not stormed then return {now, 0} end
  wake_sleepers(true)
  return {now, r.bottom}
end

local gone, before = rate_gone(r), tonumber(ARGV[6])
if r.sure and r.heard and before == 0 and gone - r.gone < rate_full / rate_wake_cut - 1 then
  r.refused = r.refused + 1 -- weighed with the next
  write_rate(KEYS[1], r)
  return {now, 0}
end
local at, current = rate_share(r, decided), rate_share(r, now)
local refused = math.max(r.refused, 0)
local weight = math.floor((refused + 1) * rate_full / (math.max(gone - r.gone, refused) + 1))
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
if wake then
  wake_sleepers(true)
else
  wake_queue(r)
end
write_rate(KEYS[1], r)
return {now, r.bottom}
