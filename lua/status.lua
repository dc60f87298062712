-- status.lua: the wave state and the number of permits held, with time applied.
--
-- KEYS[1] permits (zset)   KEYS[2] wave state (hash)   KEYS[3] permit waves (hash)
-- ARGV[1..5] wave config (base limit, probe successes, ladder ms csv, min ms, max ms)
-- Reply: {state, limit, wave, cooldown_ms, successes, step, threshold, in_flight}
if #ARGV ~= 5 then return fail('status', 'expected 5 ARGV, got ' .. #ARGV) end
local config = read_config(1)
local now = now_ms()
purge(now)
local s = load_state(config)
if poll(s, now) then save_state(s) end
local cooldown_ms = 0
if s.state == 'COOLDOWN' then cooldown_ms = math.max(0, s.cooldown_until - now) end
return { s.state, s.limit, s.wave, cooldown_ms, s.successes, s.step, s.threshold, redis.call('ZCARD', KEYS[1]) }
