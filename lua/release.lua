-- The common release of a slot of a cap of requests in flight (see
-- slots.lua): with nobody in line, nobody is to be handed the slot, and its
-- holder leaves in two commands. A script of its own, without common.lua's
-- prelude: it reads no clock and decides nothing else.
--
-- KEYS[1]  the cap's holders
-- KEYS[2]  its line
-- ARGV[1]  the id of the holder that leaves
--
-- Returns 1 when the holder left; 0, having changed nothing, when someone
-- is in line or a key holds another type than pace writes: the slots
-- script then does the release, hands the slot on, or names the key.
if redis.pcall('ZCARD', KEYS[2]) ~= 0 then return 0 end
if type(redis.pcall('ZREM', KEYS[1], ARGV[1])) ~= 'number' then return 0 end
return 1
