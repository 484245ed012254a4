-- Follows common.lua in the scripts that keep a cap of requests in flight
-- (slots.lua, and take.lua before a booking): a cap's keys are three sorted
-- sets, its holders scored by the end of their lease, its line by each
-- waiter's place, and its waiters by the end of their lease (see
-- slots.lua).

-- slot_check refuses KEYS[i] when it is not a sorted set, or, unless it is
-- a line (is_line), holds a lease that ends beyond the horizon; it returns
-- the last member's score.
local function slot_check(i, is_line)
  local last = read(i, 'ZRANGE', -1, -1, 'WITHSCORES')
  if not is_line and last[2] and tonumber(last[2]) > now + horizon then
    foreign(i, 'holds a lease that ends beyond any pace grants')
  end
  return last[2]
end

-- slot_expire makes KEYS[i] (and KEYS[also], when given: the line of the
-- waiters at i) live a lease beyond its longest lease, so that the call
-- that purges a lapsed lease can tell.
local function slot_expire(i, lease, also)
  local last = redis.call('ZRANGE', KEYS[i], -1, -1, 'WITHSCORES')
  if last[2] then
    local ms = math.ceil((tonumber(last[2]) - now + lease) / 1000) + 1
    redis.call('PEXPIRE', KEYS[i], ms)
    if also then
      redis.call('PEXPIRE', KEYS[also], ms)
    end
  end
end

-- slot_purge ends the leases that lapsed by now: of holders at KEYS[h],
-- and of waiters at KEYS[w], who leave the line at KEYS[l] too. It returns
-- how many holders' leases lapsed.
local function slot_purge(h, l, w)
  local expired = redis.call('ZREMRANGEBYSCORE', KEYS[h], '-inf', now)
  for _, id in ipairs(redis.call('ZRANGEBYSCORE', KEYS[w], '-inf', now)) do
    redis.call('ZREM', KEYS[w], id)
    redis.call('ZREM', KEYS[l], id)
  end
  return expired
end
