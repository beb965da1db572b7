-- Sets (never adds) the cost lease ARGV[1] took from a window to ARGV[2],
-- so a settle repeated after a lost reply changes nothing.
-- KEYS: the window's costs hash.
local old = tonumber(redis.call('HGET', KEYS[1], ARGV[1]))
if not old then return 0 end
local sum = (tonumber(redis.call('HGET', KEYS[1], '_sum')) or 0) - old + tonumber(ARGV[2])
if sum < 0 then sum = 0 end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2], '_sum', sum)
return 1
