-- Follows common.lua in the scripts that book (reserve.lua, quota.lua): the
-- record of a booking's call, at the last of KEYS. A call whose answer was
-- lost (a reply that the network swallowed, a connection cut after Redis
-- ran the script) is asked again with the same id, so at the same record:
-- it gets the booking the first call made instead of booking twice, and a
-- first call that runs late, after its retry, gets the retry's. Only a
-- booking ahead is recorded, until it is due and 2 s more: one due at once
-- spends its tokens as a request that was sent does, and holds no one back
-- (a sliding window's grants are named by the id, and booked once anyway).

-- recorded returns the reply recorded at KEYS[r], its wait from now: nil
-- for none.
local function recorded(r)
  local v = read(r, 'GET')
  if not v then return nil end
  local reply = {}
  for field in string.gmatch(v, '%S+') do reply[#reply + 1] = number(r, field, 2^53) end
  if #reply < 4 then
    foreign(r, 'holds a value that is not a whole number')
  end
  reply[2] = math.max(reply[2] - now, 0) -- recorded as when the booking is due
  reply[3] = now
  return reply
end

-- record records reply at KEYS[r] if it books ahead, and returns it.
local function record(r, reply)
  if reply[1] == 1 and reply[2] > 0 then
    local due = reply[3] + reply[2]
    local fields = {}
    for i, v in ipairs(reply) do fields[i] = string.format('%d', v) end
    fields[2] = string.format('%d', due)
    redis.call('SET', KEYS[r], table.concat(fields, ' '), 'PXAT', ms_expiry(due) + 2000)
  end
  return reply
end

-- booking_reply is reserve.lua's reply (see there), the last five left off
-- when all are 0: a plain booking's, which Redis then writes and the client
-- reads in fewer items.
local function booking_reply(granted, delay, finish, booked, listening, recovered, other_a, other_b)
  if booked == 0 and listening == 0 and recovered == 0 and other_a == 0 and other_b == 0 then
    return {granted, delay, now, finish}
  end
  return {granted, delay, now, finish, booked, listening, recovered, other_a, other_b}
end
