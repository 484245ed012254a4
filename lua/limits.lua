-- Follows common.lua in reserve.lua: the limits the processes of a fleet
-- pace one key at, which disagree while a deploy rolls out a new one, at
-- KEYS[r]: "A B UNTIL OA OB OUNTIL", the strictest limit booked in the
-- last 2 s (A its interval, B its burst) and another limit booked then
-- (OA OB; 0 0 when none), each standing until its UNTIL. The key books
-- at the strictest standing, whichever process books it, until all agree:
-- a limit lowered by one process holds for the fleet, and a limit raised
-- waits for the last process of the old one. A process's bookings of the
-- key announce its limit, the first in each half second (and Announce); a
-- limit stands 2 s after its last announcement, and is written again once
-- less than 1 s is left: a fleet that agrees writes the key once a second,
-- and its other bookings do not read it. While another limit stands too,
-- KEYS[r + 1] is there, and every booking reads the limits. A stricter limit that takes
-- the place of one standing (displaced) voids the bookings due after now
-- (see drop_queue): their callers, asleep in any process, book anew, at
-- the stricter limit.

local limit_stands = 2000000

-- stricter reports whether a bucket of interval a1 and burst b1 is
-- stricter than one of a2 and b2: slower, or as fast with a smaller burst.
local function stricter(a1, b1, a2, b2)
  return a1 > a2 or (a1 == a2 and b1 < b2)
end

-- displaced is the interval and burst of the limit a stricter one took
-- the place of in this call, if any: agree sets it at each call (a
-- function's library keeps its locals from one call to the next).
local displaced = nil

-- wake_sleepers publishes "KEY\nWORD NOW" on the channel of holds, as
-- the fleet names both (KEYS[r] is PREFIX{KEY}#limits, and the channel
-- PREFIX .. 'holds'): WORD "retime" for bookings taken out of the
-- schedule, "rate" for bookings their callers give back (see
-- internal/steer's ParseMessage).
local function wake_sleepers(r, word)
  local name = KEYS[r]
  local open = string.find(name, '{', 1, true)
  local close = #name + 1 - string.find(string.reverse(name), '}', 1, true)
  redis.call('PUBLISH', string.sub(name, 1, open - 1) .. 'holds',
    string.sub(name, open + 1, close - 1) .. '\n' .. word .. ' ' .. string.format('%d', now))
end

-- drop_queue takes out of the schedule of the bucket at KEYS[i], after a
-- limit was displaced, the bookings due after now (its TAT at most a
-- burst of the displaced limit ahead), and tells the fleet, whose callers
-- asleep in them book anew (KEYS[r] is the limits). A bucket the
-- upstream's counters steer keeps its schedule, which is theirs: its
-- callers give their bookings back instead.
local function drop_queue(i, r)
  local tat, steer = read_bucket(i)
  if steer then
    wake_sleepers(r, 'rate')
    return
  end
  local kept = now + displaced[1] * displaced[2]
  if tat and tat > kept then
    redis.call('SET', KEYS[i], string.format('%d', kept), 'PXAT', full_expiry(kept))
  end
  wake_sleepers(r, 'retime')
end

-- agree notes, at KEYS[r], that this booking paces the key at interval a
-- and burst b (own: the two as the record writes them, "A B ", given by
-- the caller, as string.format would cost each booking), and returns the
-- interval and burst to book at (the strictest standing) and the other
-- limit standing (0, 0 when all agree): for the strictest, another seen;
-- for any other, the strictest.
local function agree(r, a, b, own)
  displaced = nil
  local v = read(r, 'GET')
  -- The common case, read as text: this limit alone stands.
  if v and string.sub(v, 1, #own) == own and string.sub(v, -6) == ' 0 0 0' then
    local su = number(r, string.sub(v, #own + 1, -7), 2^53)
    if su > now then
      if su - now < limit_stands / 2 then
        local renew = now + limit_stands
        redis.call('SET', KEYS[r], own .. string.format('%d 0 0 0', renew), 'PXAT', ms_expiry(renew))
      end
      return a, b, 0, 0
    end
  end
  local f = {0, 0, 0, 0, 0, 0}
  if v then
    f = {}
    for field in string.gmatch(v, '%S+') do f[#f + 1] = number(r, field, 2^53) end
    if #f ~= 6 then
      foreign(r, 'holds a value that is not a whole number')
    end
  end
  local sa, sb, su, oa, ob, ou = f[1], f[2], f[3], f[4], f[5], f[6]
  if su <= now then sa, sb, su = 0, 0, 0 end
  if ou <= now then oa, ob, ou = 0, 0, 0 end
  local renew = now + limit_stands
  local changed = true
  if su == 0 or stricter(a, b, sa, sb) then
    if su ~= 0 then -- the former strictest stands on beside; its bookings ahead book anew
      oa, ob, ou = sa, sb, su
      displaced = {sa, sb}
    end
    sa, sb, su = a, b, renew
  elseif sa == a and sb == b then
    changed = su - now < limit_stands / 2
    su = changed and renew or su
  elseif oa ~= a or ob ~= b or ou - now < limit_stands / 2 then
    oa, ob, ou = a, b, renew
  else
    changed = false
  end
  if oa == sa and ob == sb then oa, ob, ou = 0, 0, 0 end
  if changed then
    redis.call('SET', KEYS[r], string.format('%d %d %d %d %d %d', sa, sb, su, oa, ob, ou), 'PXAT', ms_expiry(math.max(su, ou)))
  end
  if ou > now then -- another stands: every booking reads the limits until it lapses
    redis.call('SET', KEYS[r + 1], '1', 'PXAT', ms_expiry(ou))
  end
  if sa == a and sb == b then
    return sa, sb, oa, ob
  end
  return sa, sb, sa, sb
end
