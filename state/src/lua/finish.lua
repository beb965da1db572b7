-- Ends an admission in one round trip: settles the lease's cost in each
-- window it took from (sets, never adds), forgets the lease there (a repeat
-- changes nothing) and frees its slots.
-- KEYS: per window of the lease its cost hash and its open-lease zset,
-- then the lease's slot zsets.
-- ARGV: lease, n_windows, then per window the actual cost, or -1 to keep
-- the cost taken.
local lease, n = ARGV[1], tonumber(ARGV[2])
local field = 'l' .. lease
for i = 1, n do
  local h, o, actual = KEYS[2 * i - 1], KEYS[2 * i], tonumber(ARGV[2 + i])
  local rec = redis.call('HGET', h, field)
  if rec then
    if actual >= 0 then set_lease_cost(h, rec, actual) end
    redis.call('HDEL', h, field)
  end
  redis.call('ZREM', o, lease)
end
for i = 2 * n + 1, #KEYS do
  redis.call('ZREM', KEYS[i], lease)
end
return 1
