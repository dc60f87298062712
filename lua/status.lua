-- status.lua: the wave state, the permits held and the rate budgets left, with time applied.
--
-- KEYS[1] permits (zset)   KEYS[2] wave state (hash)   KEYS[3] permit waves (hash)
-- KEYS[4..7] the waiting list and the fleet's counts (see acquire.lua; with priority classes only)
-- ARGV[1..18] config (see read_config in wave.lua)
-- Reply: {state, limit, wave, cooldown_ms, successes, step, threshold, in_flight,
--         requests_remaining, requests_next_ms, tokens_remaining, tokens_next_ms (of the budgets in
--         force: the configured ones tightened by the learned limits),
--         the learned limits kept: requests limit, window ms, ms until forgotten, the same for
--         tokens, input and output (-1 each when none),
--         input_remaining, input_next_ms, output_remaining, output_next_ms (the input and
--         output tokens budgets),
--         requests_day_remaining, requests_day_next_ms, tokens_day_remaining, tokens_day_next_ms
--         (the requests and tokens per day budgets),
--         then per priority class, in configured order: in_flight, callers waiting}
--   (the budget fields are -1 when there is no such budget)
if #ARGV ~= CONFIG_ARGS then return fail('status', 'expected ' .. CONFIG_ARGS .. ' ARGV, got ' .. #ARGV) end
local config = read_config(1)
local now = now_ms()
rebudget(config, now * 1000) -- a changed rate keeps its budget's units (wave.lua)
ll_apply(config, now)
purge(now)
local s = load_state(config, now)
if poll(s, now) then save_state(s, config) end
local cooldown_ms = 0
if s.state == 'COOLDOWN' then cooldown_ms = math.max(0, s.cooldown_until - now) end
local reply = { s.state, s.limit, s.wave, cooldown_ms, s.successes, s.step, s.threshold, redis.call('ZCARD', KEYS[1]) }
local function left(names)
  for _, name in ipairs(names) do
    local b = config[name]
    if b then
      local remaining, next_ms = gcra_remaining(b, load_tat(name .. '_tat', b, now * 1000), now * 1000)
      table.insert(reply, remaining)
      table.insert(reply, next_ms)
    else
      table.insert(reply, -1)
      table.insert(reply, -1)
    end
  end
end
left({ 'requests', 'tokens' })
for _, field in ipairs(ll_status(now)) do table.insert(reply, field) end
left({ 'input', 'output' })
left({ 'requests_day', 'tokens_day' })
if #config.classes > 0 then
  local classes = fleet_classes(config, s.limit, now, false)
  for _, c in ipairs(classes) do
    table.insert(reply, c.in_flight)
    table.insert(reply, c.demand)
  end
end
return reply
