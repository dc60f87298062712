-- finish.lua: release a permit by id (idempotent) and report its outcome for its wave.
--
-- KEYS[1] permits (zset)   KEYS[2] wave state (hash)   KEYS[3] permit waves (hash)
-- ARGV[1..5] wave config (base limit, probe successes, ladder ms csv, min ms, max ms)
-- ARGV[6] permit id
-- ARGV[7] the wave the permit was issued in
-- ARGV[8] outcome: 'success', 'rate_limited' or 'neutral'
-- ARGV[9] Retry-After in ms for 'rate_limited', or '' when the provider gave none
-- ARGV[10] channel to PUBLISH to when a permit is freed, or '' for none
-- Reply: {held, effect, limit_before, limit, wave, state, cooldown_ms, changed_from, in_flight}
--   held: 1 if the id was held; effect: 'cut', 'late' or 'none';
--   changed_from: the state a success moved the machine out of, or ''.
if #ARGV ~= 10 then return fail('finish', 'expected 10 ARGV, got ' .. #ARGV) end
local config = read_config(1)
local id = ARGV[6]
local wave = to_int(ARGV[7], 'wave')
local outcome = ARGV[8]
local retry_after = nil
if ARGV[9] ~= '' then retry_after = to_int(ARGV[9], 'retry after') end
local now = now_ms()

purge(now)
local s = load_state(config)
poll(s, now)
local limit_before = s.limit
local effect = 'none'
local changed_from = ''
if outcome == 'success' then
  changed_from = on_success(s, wave, config) or ''
elseif outcome == 'rate_limited' then
  effect, limit_before = on_rate_limited(s, wave, now, retry_after, config)
elseif outcome ~= 'neutral' then
  return fail('finish', 'unknown outcome ' .. outcome)
end
save_state(s)

local held = redis.call('ZREM', KEYS[1], id)
redis.call('HDEL', KEYS[3], id)
if held == 1 and ARGV[10] ~= '' then redis.call('PUBLISH', ARGV[10], id) end
local cooldown_ms = 0
if s.state == 'COOLDOWN' then cooldown_ms = math.max(0, s.cooldown_until - now) end
return { held, effect, limit_before, s.limit, s.wave, s.state, cooldown_ms, changed_from,
         redis.call('ZCARD', KEYS[1]) }
