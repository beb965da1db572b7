-- Ends an admission in one round trip: settles the lease's cost in each
-- window (sets, never adds: a repeat changes nothing) and frees its slots.
-- KEYS: n_settle window cost hashes, then the slot zsets.
-- ARGV: lease, n_settle, then one actual cost per settled window.
local lease, n = ARGV[1], tonumber(ARGV[2])
for i = 1, n do
  local h = KEYS[i]
  local old = tonumber(redis.call('HGET', h, lease))
  if old then
    local sum = (tonumber(redis.call('HGET', h, '_sum')) or 0) - old + tonumber(ARGV[2 + i])
    if sum < 0 then sum = 0 end
    redis.call('HSET', h, lease, ARGV[2 + i], '_sum', sum)
  end
end
for i = n + 1, #KEYS do
  redis.call('ZREM', KEYS[i], lease)
end
return 1
