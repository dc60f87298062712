-- acquire.lua: grant one permit by client id, or say why not and for how long.
--
-- KEYS[1] permits (zset)   KEYS[2] wave state (hash)   KEYS[3] permit waves (hash)
-- ARGV[1..5] wave config (base limit, probe successes, ladder ms csv, min ms, max ms)
-- ARGV[6] permit id (client-chosen; an id already held is granted again, not twice)
-- ARGV[7] lease in ms
-- Reply: {1, wave, state, limit, in_flight}        granted
--        {0, reason, wait_ms, in_flight}           denied: reason 'cooldown' or 'at_limit'
if #ARGV ~= 7 then return fail('acquire', 'expected 7 ARGV, got ' .. #ARGV) end
local config = read_config(1)
local id = ARGV[6]
local lease = to_int(ARGV[7], 'lease')
local now = now_ms()

purge(now)
local s = load_state(config)
local changed = poll(s, now)

local held_wave = redis.call('HGET', KEYS[3], id)
if held_wave then
  redis.call('ZADD', KEYS[1], 'GT', now + lease, id)
  if changed then save_state(s) end
  return { 1, tonumber(held_wave), s.state, s.limit, redis.call('ZCARD', KEYS[1]) }
end

local in_flight = redis.call('ZCARD', KEYS[1])
local result
if s.state == 'COOLDOWN' then
  result = { 0, 'cooldown', math.max(0, s.cooldown_until - now), in_flight }
elseif in_flight >= s.limit then
  result = { 0, 'at_limit', 0, in_flight }
else
  redis.call('ZADD', KEYS[1], now + lease, id)
  redis.call('HSET', KEYS[3], id, s.wave)
  result = { 1, s.wave, s.state, s.limit, in_flight + 1 }
end
if changed or redis.call('EXISTS', KEYS[2]) == 0 then save_state(s) end
return result
