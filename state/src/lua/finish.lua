-- Ends an admission in one round trip: settles the lease's cost in each
-- window it took from (sets, never adds), forgets the lease there (a repeat
-- changes nothing) and frees its slots.
-- KEYS: the lease's n_windows window cost hashes, then its slot zsets.
-- ARGV: lease, n_windows, then per window the actual cost, or -1 to keep
-- the cost taken.
local lease, n = ARGV[1], tonumber(ARGV[2])
local field = 'l' .. lease
for i = 1, n do
  local h, actual = KEYS[i], tonumber(ARGV[2 + i])
  local rec = redis.call('HGET', h, field)
  if rec then
    if actual >= 0 then set_lease_cost(h, rec, actual) end
    redis.call('HDEL', h, field)
  end
end
for i = n + 1, #KEYS do
  redis.call('ZREM', KEYS[i], lease)
end
return 1
