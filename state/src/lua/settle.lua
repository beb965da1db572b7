-- Sets (never adds) the cost lease ARGV[1] took from a window to ARGV[2],
-- so a settle repeated after a lost reply changes nothing. Once the lease's
-- slice has aged out, or the lease was finished, nothing changes.
-- KEYS: the window's costs hash.
local h, field, actual = KEYS[1], 'l' .. ARGV[1], tonumber(ARGV[2])
local rec = redis.call('HGET', h, field)
if not rec then return 0 end
local e = set_lease_cost(h, rec, actual)
if not e then return 0 end
-- `%d`: a number concatenated as is is written `%.14g` (exponent form
-- from 10^14), which set_lease_cost's pattern would not read back.
redis.call('HSET', h, field, e .. ':' .. string.format('%d', actual))
return 1
