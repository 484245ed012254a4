-- Follows common.lua in the scripts that change a booking made earlier
-- (refund.lua, settle.lua), whose KEYS hold each limit's key and its gaps
-- (KEYS[2i-1], KEYS[2i]).

-- read_booking reads, and checks, limit i's keys for a booking at slot: a
-- bucket's schedule (TAT); or, for a fixed window of length a when
-- with_count, the field of the booking's window and its count.
local function read_booking(i, kind, a, slot, with_count)
  if kind == 1 then
    local tat = time(2 * i - 1, read(2 * i - 1, 'GET'))
    read(2 * i, 'ZCARD')
    return tat
  elseif kind == 2 then
    read(2 * i - 1, 'ZCARD')
  elseif with_count then
    local field = string.format('%d', (slot - slot % a) / a)
    return nil, field, number(2 * i - 1, read(2 * i - 1, 'HGET', field), 2^53)
  end
end
