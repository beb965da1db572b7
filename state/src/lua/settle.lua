-- Sets (never adds) the cost lease ARGV[1] took from a window to ARGV[2],
-- so a settle repeated after a lost reply changes nothing. Once the lease's
-- slice has aged out, or the lease was finished, nothing changes.
-- KEYS: the window's costs hash.
local h, field, actual = KEYS[1], 'l' .. ARGV[1], tonumber(ARGV[2])
local rec = redis.call('HGET', h, field)
if not rec then return 0 end
local e, old = string.match(rec, '^(%d+):(%d+)$')
old = tonumber(old)
local c = tonumber(redis.call('HGET', h, e))
if c then
  c = c - old + actual
  if c < 0 then c = 0 end
  local sum = (tonumber(redis.call('HGET', h, '_sum')) or 0) - old + actual
  if sum < 0 then sum = 0 end
  redis.call('HSET', h, e, c, '_sum', sum)
end
redis.call('HSET', h, field, e .. ':' .. actual)
return 1
