-- Replaces a versioned record if its version is still the one read.
-- KEYS: the record hash. ARGV: now_ms, expected version ('' = absent),
-- value, ttl_ms. Returns 1 when swapped, 0 when someone changed it first.
local cur = redis.call('HMGET', KEYS[1], 'v', 'exp')
local now = tonumber(ARGV[1])
local v = nil
if cur[1] and (tonumber(cur[2]) or 0) > now then v = tonumber(cur[1]) end
if (ARGV[2] == '' and v ~= nil) or (ARGV[2] ~= '' and v ~= tonumber(ARGV[2])) then
  return 0
end
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'v', (v or 0) + 1, 'd', ARGV[3], 'exp', now + tonumber(ARGV[4]))
redis.call('PEXPIRE', KEYS[1], ARGV[4])
return 1
