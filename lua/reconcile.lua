-- reconcile.lua: after an outage, make the shared set match what this process really holds.
--
-- KEYS[1] permits (zset)   KEYS[2] wave state (hash)   KEYS[3] permit waves (hash)
-- ARGV[1..5] wave config (base limit, probe successes, ladder ms csv, min ms, max ms)
-- ARGV[6] lease in ms for the adopted permits
-- ARGV[7] n, the number of ids to adopt; ARGV[8 .. 7+n] their ids: permits still in flight
--         here, registered (or re-registered, after a restart with empty data) in the current
--         wave without an admission check, since their calls are already running
-- ARGV[8+n ..] ids to drop: permits that finished during the outage but may still be listed
-- Reply: {wave, state, limit, in_flight} after the call; adopted permits carry `wave`.
if #ARGV < 7 then return fail('reconcile', 'expected at least 7 ARGV, got ' .. #ARGV) end
local config = read_config(1)
local lease = to_int(ARGV[6], 'lease')
local adopt = to_int(ARGV[7], 'adopt count')
if #ARGV < 7 + adopt then return fail('reconcile', 'fewer ids than the adopt count') end
local now = now_ms()

purge(now)
local s = load_state(config)
poll(s, now)
save_state(s)
for i = 8, 7 + adopt do
  redis.call('ZADD', KEYS[1], now + lease, ARGV[i])
  redis.call('HSET', KEYS[3], ARGV[i], s.wave)
end
for i = 8 + adopt, #ARGV do
  redis.call('ZREM', KEYS[1], ARGV[i])
  redis.call('HDEL', KEYS[3], ARGV[i])
end
return { s.wave, s.state, s.limit, redis.call('ZCARD', KEYS[1]) }
