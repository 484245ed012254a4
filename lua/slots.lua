-- The slots of a key's cap of requests in flight (Concurrent): leases on
-- Redis's clock, and a line of waiters, first come first served.
--
-- KEYS[1]  holders: a sorted set of slot ids, scored by the end of their lease
-- KEYS[2]  line: a sorted set of waiting ids, scored by their place in line
-- KEYS[3]  waiters: a sorted set of waiting ids, scored by the end of their lease
--
-- ARGV[1]  what to do with the id: "acquire" (hold a slot, else join the
--          line), "wait" (still waiting: renew the waiter's lease), "renew"
--          (still holding: renew the lease, taking the slot again if it
--          lapsed), "release" (done, or no longer waiting)
-- ARGV[2]  the id, unique to one request
-- ARGV[3]  the cap: how many may hold a slot at once
-- ARGV[4]  the lease, in microseconds
-- ARGV[5]  the channel, and ARGV[6] the key, of the message that tells a
--          waiter its slot: "KEY\nslot ID"
--
-- Leases that ended are purged first; free slots then go to the waiters
-- first in line, each told by a message (the id's own caller by the reply).
-- A waiter that misses its message finds its slot at its next "wait".
--
-- Returns {now, the id's state ("held", "waiting" or "none"), when the first
-- holder's lease ends (0 for none), how many leases of holders ended unrenewed},
-- times in microseconds, as strings.
local holders, line, waiters = 1, 2, 3
local op, id, cap, lease = ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])

slot_check(holders)
local last_place = slot_check(line, true)
slot_check(waiters)
local expired = slot_purge(holders, line, waiters)

-- The common case: a free slot and nobody in line.
if op == 'acquire' and not last_place and redis.call('ZCARD', KEYS[holders]) < cap then
  redis.call('ZADD', KEYS[holders], now + lease, id)
  slot_expire(holders, lease)
  local first = redis.call('ZRANGE', KEYS[holders], 0, 0, 'WITHSCORES')
  return {string.format('%d', now), 'held', first[2], expired}
end

if op == 'acquire' then
  redis.call('ZADD', KEYS[line], (tonumber(last_place) or 0) + 1, id)
  redis.call('ZADD', KEYS[waiters], now + lease, id)
elseif op == 'wait' then
  redis.call('ZADD', KEYS[waiters], 'XX', now + lease, id)
elseif op == 'renew' then
  redis.call('ZADD', KEYS[holders], now + lease, id)
else
  redis.call('ZREM', KEYS[holders], id)
  redis.call('ZREM', KEYS[line], id)
  redis.call('ZREM', KEYS[waiters], id)
end

-- A waiter given a slot keeps its waiter's lease: alive, it renews its
-- slot within a third of a lease of being told, well before; dead, its
-- slot lapses when its place in line would have.
local free = cap - redis.call('ZCARD', KEYS[holders])
if free > 0 then
  for _, w in ipairs(redis.call('ZRANGE', KEYS[line], 0, free - 1)) do
    local ends = now + lease
    if w ~= id then
      ends = tonumber(redis.call('ZSCORE', KEYS[waiters], w)) or ends
    end
    redis.call('ZREM', KEYS[line], w)
    redis.call('ZREM', KEYS[waiters], w)
    redis.call('ZADD', KEYS[holders], ends, w)
    if w ~= id then
      redis.call('PUBLISH', ARGV[5], ARGV[6] .. '\nslot ' .. w)
    end
  end
end

local state = 'none'
if redis.call('ZSCORE', KEYS[holders], id) then
  state = 'held'
elseif redis.call('ZSCORE', KEYS[line], id) then
  state = 'waiting'
end

slot_expire(holders, lease)
slot_expire(waiters, lease, line)
local first = redis.call('ZRANGE', KEYS[holders], 0, 0, 'WITHSCORES')
return {string.format('%d', now), state, first[2] or '0', expired}
