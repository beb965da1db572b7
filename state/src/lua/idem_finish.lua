-- Records how a claimed request ended. KEYS: the record hash.
-- ARGV: state ('forget' | 'done' | 'failed' | 'unrecorded'), now_ms,
--       and for 'done': status, has_ct, ct, body.
if ARGV[1] == 'forget' then
  redis.call('DEL', KEYS[1])
  return 1
end
local exp = tonumber(redis.call('HGET', KEYS[1], 'exp'))
if not exp or exp <= tonumber(ARGV[2]) then return 0 end
redis.call('HSET', KEYS[1], 'st', ARGV[1])
if ARGV[1] == 'done' then
  redis.call('HSET', KEYS[1], 'status', ARGV[3], 'has_ct', ARGV[4], 'ct', ARGV[5], 'body', ARGV[6])
end
return 1
