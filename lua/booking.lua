-- Follows common.lua in the scripts that change a booking made earlier
-- (refund.lua, settle.lua), whose KEYS hold each limit's key and its gaps
-- (KEYS[2i-1], KEYS[2i]).

-- unit is how far one unit moves the schedule of a bucket of configured
-- interval a and burst b at now (see bucket_step).
local function unit(steer, tat, a, b)
  local _, i = bucket_step(tat, steer, a, b, now)
  return i
end

-- read_booking reads, and checks, limit i's keys for a booking at due: a
-- bucket's schedule (TAT), how many gaps it has and its steering; or, for a
-- fixed window of windows spec (see window_at) when with_count, the field
-- of the booking's window and its count.
local function read_booking(i, kind, spec, due, with_count)
  if kind == 1 then
    local tat, steer = read_bucket(2 * i - 1)
    return tat, nil, read(2 * i, 'ZCARD'), steer
  elseif kind == 2 then
    read(2 * i - 1, 'ZCARD')
  elseif with_count then
    local _, _, field = window_at(spec, due)
    if not field then return nil end -- a calendar's window told no more: gone
    return nil, field, number(2 * i - 1, read(2 * i - 1, 'HGET', field), 2^53)
  end
end
