-- Before a booking (reserve.lua or quota.lua, which runs as a function
-- after it, its reply handed to slot_taken): the slot of a cap of requests
-- in flight (see slots.lua) that a request takes with its booking, in one
-- call, when one is free and nobody waits for one.
--
-- KEYS[#KEYS - 2], KEYS[#KEYS - 1], KEYS[#KEYS]  the cap's holders, line
--          and waiters (see slots.lua)
-- ARGV[#ARGV - 3]  the size of the booking's reply
-- ARGV[#ARGV - 2]  the request's id, unique to it
-- ARGV[#ARGV - 1]  the cap: how many may hold a slot at once
-- ARGV[#ARGV]      the lease, in microseconds
--
-- These are taken off before the booking reads its own keys and arguments.
-- The slot goes to the request if the cap has a free slot, counting the
-- holders whose lease lapsed, and nobody is in line (or the request holds
-- it already: a call asked again; the waiters are those in line, so the
-- line alone is read), and only if the booking is granted: the
-- slot's lease then runs from the booking's time, not before. Otherwise
-- nothing is booked, and the reply is the booking's, all zeros but now,
-- with -1 as its first item: the request goes in line (slots.lua), whose
-- call purges the lapsed leases, reports them and hands their slots on.
local take_holders, take_line, take_waiters = #KEYS - 2, #KEYS - 1, #KEYS
local take_size = tonumber(ARGV[#ARGV - 3])
local take_id, take_cap, take_lease = ARGV[#ARGV - 2], tonumber(ARGV[#ARGV - 1]), tonumber(ARGV[#ARGV])
local take_held = read(take_holders, 'ZCARD')
local take_free = read(take_line, 'ZCARD') == 0 and
  (take_held < take_cap or redis.call('ZSCORE', KEYS[take_holders], take_id) ~= false)
local take_keys = {KEYS[take_holders], KEYS[take_line], KEYS[take_waiters]}
for _ = 1, 3 do
  KEYS[#KEYS] = nil
  ARGV[#ARGV] = nil
end
ARGV[#ARGV] = nil
if not take_free then
  local busy = {-1, 0, now}
  for _ = 4, take_size do busy[#busy + 1] = 0 end
  return busy
end

-- slot_taken takes the slot for a granted booking (reply), from its time
-- to a lease beyond, or, for a refused one, frees the slot an earlier
-- booking of the request took (its key retimed, or a hold came, while it
-- slept), and returns reply. The holders live a lease beyond
-- their longest lease (see slot_expire): a key this call made gets its
-- expiry, and one that held leases already a later one only (GT).
local function slot_taken(reply)
  for _, k in ipairs(take_keys) do KEYS[#KEYS + 1] = k end
  if reply[1] ~= 1 then -- refused: a booking of this request's asked again keeps no slot either
    redis.call('ZREM', KEYS[take_holders], take_id)
  else
    local ends = now + reply[2] + take_lease
    redis.call('ZADD', KEYS[take_holders], ends, take_id)
    local ms = math.ceil((ends - now + take_lease) / 1000) + 1
    if take_held == 0 then
      redis.call('PEXPIRE', KEYS[take_holders], ms)
    else
      redis.call('PEXPIRE', KEYS[take_holders], ms, 'GT')
    end
  end
  return reply
end
