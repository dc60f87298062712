-- status.lua: the wave state, the permits held and the rate budgets left, with time applied.
--
-- KEYS[1] permits (zset)   KEYS[2] wave state (hash)   KEYS[3] permit waves (hash)
-- ARGV[1..13] config (see read_config in wave.lua)
-- Reply: {state, limit, wave, cooldown_ms, successes, step, threshold, in_flight,
--         requests_remaining, requests_next_ms, tokens_remaining, tokens_next_ms}
--   (the budget fields are -1 when there is no such budget)
if #ARGV ~= CONFIG_ARGS then return fail('status', 'expected ' .. CONFIG_ARGS .. ' ARGV, got ' .. #ARGV) end
local config = read_config(1)
local now = now_ms()
purge(now)
local s = load_state(config)
if poll(s, now) then save_state(s, config) end
local cooldown_ms = 0
if s.state == 'COOLDOWN' then cooldown_ms = math.max(0, s.cooldown_until - now) end
local reply = { s.state, s.limit, s.wave, cooldown_ms, s.successes, s.step, s.threshold, redis.call('ZCARD', KEYS[1]) }
for _, name in ipairs({ 'requests', 'tokens' }) do
  local b = config[name]
  if b then
    local remaining, next_ms = gcra_remaining(b, load_tat(name .. '_tat'), now * 1000)
    table.insert(reply, remaining)
    table.insert(reply, next_ms)
  else
    table.insert(reply, -1)
    table.insert(reply, -1)
  end
end
return reply
