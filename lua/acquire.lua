-- acquire.lua: grant one permit by client id, or say why not and for how long.
--
-- KEYS[1] permits (zset)   KEYS[2] wave state (hash)   KEYS[3] permit waves (hash)
-- KEYS[4] processes waiting at the limit (zset: since when)
-- KEYS[5] the same processes (zset: when each last asked; see finish.lua)
-- KEYS[6] how many callers of each waiting process wait, by class, and the fleet's counts
--         (hash; classes only: priority.lua, fleet.lua)
-- KEYS[7] the waiting members of each class and tenant in order (zset; classes only: fleet.lua)
-- ARGV[1..18] config (see read_config in wave.lua)
-- ARGV[19] permit id (client-chosen; an id already held is granted again, not twice, and
--          nothing is charged again)
-- ARGV[20] lease in ms
-- ARGV[21] tokens to reserve from the tokens budget (0 without one): '<tokens>', or
--          '<tokens>:<output>' with the answer's part (for the output budget; the rest is
--          reserved from the input budget)
-- ARGV[22] the asking process's instance id, put on the waiting list when the limit is
--          reached (so a release wakes it) and taken off when it is granted; '' for none.
--          Without classes the ask refused at the limit is kept with it (KEYS[6]
--          'h:<instance>' = '<lease> <tokens> <output> <id>'): a release may grant it
--          (finish.lua's hand-off), and a grant takes it off
-- ARGV[23] the generation of the state the process last saw, '' for none yet (see
--          `generation` in wave.lua: if it is gone, WAVEGATE_LOST and nothing is written;
--          with '' a state that has none gets one)
-- With priority classes (priority.lua), the ask is one head per class the process has
-- waiting callers in: ARGV[24] the class of ARGV[19], ARGV[25] its callers waiting, then
-- groups of four (class, permit id, tokens as ARGV[21], callers waiting) for its other classes. The
-- permit goes to the first of them the fleet-wide choice of class reaches.
-- Reply: {1, wave, state, limit, in_flight, id, gen}    granted (id: which ask)
--        {0, reason, wait_ms, in_flight, id, gen}       denied: reason 'cooldown', 'at_limit',
--                                                  'requests', 'tokens', 'tokens_exceed_burst',
--                                                  'provider_window' or 'earlier_waiter' (the
--                                                  budgets' room is another process's turn,
--                                                  budget_turn.lua); id: the ask it answers
--                                                  (the one the choice reached, else the first)
--        either followed, with a day budget, by what is left of the day budgets after it,
--        '<requests>:<tokens>' (day_left in wave.lua; not after a refusal before the check
--        or a permit already held)
-- An ask whose estimate is above the tokens burst in force (for a class with a budget share,
-- the smaller of it and the class's own burst) can never fit: the first such ask is refused
-- before anything else, naming it, and nothing is written. It fails only itself: the process
-- asks again at once with its other heads, which the refusal did not make wait. Then the
-- wave and the limit (and the class) are checked, then the budgets; all are charged together
-- or not at all. (wavegate_core::LocalGate::acquire is the Rust twin.)
local n = #ARGV - CONFIG_ARGS
if n ~= 5 and (n < 7 or (n - 7) % 4 ~= 0) then
  return fail('acquire', 'expected ' .. (CONFIG_ARGS + 5) .. ' ARGV, or classes after them, got ' .. #ARGV)
end
local config = read_config(1)
local lease = to_int(ARGV[CONFIG_ARGS + 2], 'lease')
local instance = ARGV[CONFIG_ARGS + 4]
local asks = { { id = ARGV[CONFIG_ARGS + 1], class = '', demand = 1 } }
asks[1].tokens, asks[1].output = to_cost(ARGV[CONFIG_ARGS + 3], 'tokens')
if n >= 7 then
  asks[1].class, asks[1].demand = ARGV[CONFIG_ARGS + 6], to_int(ARGV[CONFIG_ARGS + 7], 'demand')
  for at = CONFIG_ARGS + 8, #ARGV, 4 do
    local tokens, output = to_cost(ARGV[at + 2], 'tokens')
    table.insert(asks, { class = ARGV[at], id = ARGV[at + 1], tokens = tokens, output = output,
                         demand = to_int(ARGV[at + 3], 'demand') })
  end
end
local classes = #config.classes > 0 and n >= 7
local gen = generation(ARGV[CONFIG_ARGS + 5], true)
if not gen then return state_lost('acquire') end
local now = now_ms()
rebudget(config, now * 1000) -- a changed rate keeps its budget's units (wave.lua)
ll_apply(config, now) -- the learned limits tighten the budgets (learned_limit.lua)

purge(now)
local s = load_state(config, now)
local changed = poll(s, now)

for _, ask in ipairs(asks) do
  local held_wave = redis.call('HGET', KEYS[3], ask.id)
  if held_wave then
    if redis.call('ZADD', KEYS[1], 'GT', now + lease, ask.id) == 1 then pc_change(ask.id, 1) end
    if changed then save_state(s, config) end
    pc_flush()
    return { 1, tonumber(held_wave), s.state, s.limit, redis.call('ZCARD', KEYS[1]), ask.id, gen }
  end
end

local in_flight = redis.call('ZCARD', KEYS[1])
-- Never fits: refused first, naming the ask, so neither it nor the others are told to wait.
if config.tokens then
  for _, a in ipairs(asks) do
    local burst = config.tokens.burst
    local own = classes and config.classes[config.class_index[a.class] or config.default_class]
    if own and own.tokens then burst = math.min(burst, own.tokens.burst) end
    if a.tokens > burst then
      if changed then save_state(s, config) end
      return { 0, 'tokens_exceed_burst', 0, in_flight, a.id, gen }
    end
  end
end
-- The same for the input and output parts (split_budget in wave.lua) and the tokens per day.
for _, a in ipairs(asks) do
  local input_above = config.input and a.tokens - a.output > config.input.burst
  local day_above = config.tokens_day and a.tokens > config.tokens_day.burst
  if input_above or day_above or (config.output and a.output > config.output.burst) then
    if changed then save_state(s, config) end
    return { 0, 'tokens_exceed_burst', 0, in_flight, a.id, gen }
  end
end
local denial, wait = wave_denial(s, now, in_flight)
local ask = asks[1]
-- A process not on the waiting list yet that asks with room to spare is granted at once in the
-- common case: its offers join the choice in memory, and it is put on the list only if it
-- still waits afterwards (no writes to add and remove it again).
local deferred = false
if classes and instance ~= '' then
  local choosing = not denial
  if choosing then
    local members = {}
    for _, c in ipairs(config.classes) do table.insert(members, c.name .. '|' .. instance) end
    deferred = true
    for _, since in ipairs(redis.call('ZMSCORE', KEYS[5], unpack(members))) do
      if since then deferred = false end
    end
  end
  if not deferred then register_waiting(config, instance, asks, now, true) end
  if choosing then
    -- Room: which class gets it, fleet-wide; the ask waits if its classes are not reached.
    local asked = {}
    for k, a in ipairs(asks) do
      local c = config.class_index[a.class] or config.default_class
      asked[c] = asked[c] or {}
      asked[c][tenant_of(a.id)] = k
    end
    local fleet = fleet_classes(config, s.limit, now, true, in_flight)
    if deferred then add_offers(config, fleet, instance, asks, now) end
    local asked_tokens = {}
    for _, a in ipairs(asks) do
      local c = config.class_index[a.class] or config.default_class
      asked_tokens[c] = math.max(asked_tokens[c] or 0, a.tokens)
    end
    cap_classes(config, fleet, now, asked_tokens)
    local turns = load_turns(config, k6_fetch) -- read with the fleet's counts (fleet.lua)
    observe_turns(config, turns, fleet, true)
    local k, chosen, by_reserve = choose_grant(fleet, s.limit - in_flight, asked)
    if k then
      ask = asks[k]
      ask.class_index = chosen
      if not by_reserve then ask.turns = turns end
    else
      denial, wait = 'at_limit', 0
    end
  end
end
local id, tokens = ask.id, ask.tokens
-- [provider windows] checked after the wave and the limit, before the budgets (provider_window.lua)
local windows = pw_load(now)
local window_wait = pw_wait(windows, now, tokens, ask.output)
-- [/provider windows]
local result
if denial then
  if denial == 'at_limit' and instance ~= '' and not classes then
    -- The place is kept from the first ask (NX); asking again says the process still waits.
    redis.call('ZADD', KEYS[4], 'NX', now, instance)
    redis.call('ZADD', KEYS[5], now, instance)
    -- What a release may hand it (finish.lua's hand_off; the last ask replaces an earlier one).
    redis.call('HSET', KEYS[6], 'h:' .. instance, lease .. ' ' .. tokens .. ' ' .. ask.output .. ' ' .. id)
  end
  result = { 0, denial, wait, in_flight, id }
elseif window_wait then -- [provider windows]
  result = { 0, 'provider_window', window_wait, in_flight, id }
  if not classes then budget_turn_refused(instance, now, window_wait) end
else
  local now_us = now * 1000
  local requests_tat, requests_wait, tokens_tat, tokens_wait = nil, 0, nil, 0
  if config.requests then requests_tat, requests_wait = gcra_check(config.requests, load_tat('requests_tat', config.requests, now_us), now_us, 1) end
  if config.tokens then tokens_tat, tokens_wait = gcra_check(config.tokens, load_tat('tokens_tat', config.tokens, now_us), now_us, tokens) end
  -- The input and output parts, each from its own budget; a refusal of either is the tokens'.
  local input_tat, output_tat, part_wait = nil, nil, 0
  if config.input then
    local tat = load_tat('input_tat', config.input, now_us)
    input_tat, part_wait = gcra_check(config.input, tat, now_us, tokens - ask.output)
    tokens_wait = math.max(tokens_wait, part_wait)
  end
  if config.output then
    local tat = load_tat('output_tat', config.output, now_us)
    output_tat, part_wait = gcra_check(config.output, tat, now_us, ask.output)
    tokens_wait = math.max(tokens_wait, part_wait)
  end
  -- The day budgets: a refusal of either is the requests' or the tokens'.
  local requests_day_tat, tokens_day_tat, day_wait = nil, nil, 0
  if config.requests_day then
    local tat = load_tat('requests_day_tat', config.requests_day, now_us)
    requests_day_tat, day_wait = gcra_check(config.requests_day, tat, now_us, 1)
    requests_wait = math.max(requests_wait, day_wait)
  end
  if config.tokens_day then
    local tat = load_tat('tokens_day_tat', config.tokens_day, now_us)
    tokens_day_tat, day_wait = gcra_check(config.tokens_day, tat, now_us, tokens)
    tokens_wait = math.max(tokens_wait, day_wait)
  end
  -- Without classes, the turn at the budgets' room (budget_turn.lua); with classes the fleet's
  -- choice of class orders the waiters.
  local turn_wait = nil
  if not classes and requests_wait == 0 and tokens_wait == 0 then turn_wait = budget_turn_wait(instance, now) end
  if requests_wait > 0 or tokens_wait > 0 then
    local reason = 'requests'
    if tokens_wait > requests_wait then reason = 'tokens' end
    result = { 0, reason, math.max(requests_wait, tokens_wait), in_flight, id }
    if not classes then budget_turn_refused(instance, now, math.max(requests_wait, tokens_wait)) end
  elseif turn_wait then
    result = { 0, 'earlier_waiter', turn_wait, in_flight, id }
  else
    if not classes then budget_turn_granted(instance, now) end
    if requests_tat then save_tat('requests_tat', requests_tat) end
    if tokens_tat then save_tat('tokens_tat', tokens_tat) end
    if input_tat then save_tat('input_tat', input_tat) end
    if output_tat then save_tat('output_tat', output_tat) end
    if requests_day_tat then save_tat('requests_day_tat', requests_day_tat) end
    if tokens_day_tat then save_tat('tokens_day_tat', tokens_day_tat) end
    if ask.class_index then charge_class(config, ask.class_index, now, tokens) end
    pw_grant(windows, now, id, s.wave, lease, tokens, ask.output) -- [provider windows]
    if ask.turns then turns_granted(config, ask.turns, ask.class_index) end
    if deferred then
      -- Only what still waits goes on the list.
      local left = {}
      for _, a in ipairs(asks) do
        local demand = a.demand - (a == ask and 1 or 0)
        if demand > 0 then table.insert(left, { class = a.class, id = a.id, demand = demand }) end
      end
      if #left > 0 then register_waiting(config, instance, left, now, false) end
      deferred = false
    elseif classes and instance ~= '' then
      granted_waiting(config, instance, ask, asks, now)
    elseif instance ~= '' then
      redis.call('ZREM', KEYS[4], instance)
      redis.call('ZREM', KEYS[5], instance)
      redis.call('HDEL', KEYS[6], 'h:' .. instance)
    end
    result = { 1, s.wave, s.state, s.limit, in_flight + 1, id }
  end
end
-- Not granted after all (the provider's window, a budget): the asks wait, on the list.
if deferred then register_waiting(config, instance, asks, now, false) end
if changed or not state_read({ 'state' })[1] then save_state(s, config) end
pc_flush()
result[#result + 1] = gen
result[#result + 1] = day_left(config, now * 1000) -- nil (nothing added) without a day budget
return result
