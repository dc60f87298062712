-- reconcile.lua: after an outage, make the shared set match what this process really holds.
--
-- KEYS[1] permits (zset)   KEYS[2] wave state (hash)   KEYS[3] permit waves (hash)
-- ARGV[1..18] config (see read_config in wave.lua)
-- ARGV[19] lease in ms for the adopted permits
-- ARGV[20] requests and ARGV[21] tokens used during the outage, ARGV[22] how long ago (ms) they
--          can be charged from (the latest start their grants' times allow, ChargeStart):
--          charged to the per-minute budgets up to empty (gcra_charge_past in wave.lua), to the
--          day budgets as used from that start (gcra_charge_since: a day's units stay spent, a
--          refill the usage's times allow is not taken twice; LocalGate::charge)
-- ARGV[23] the state and limit this process last saw in the store, 'STATE:limit', or '': put
--         back if the store forgot its state (see carry_back in wave.lua)
-- ARGV[24] what this process last heard is left of the day budgets, as of now and before the
--         outage's usage, and the generation it heard it in: '<requests>:<tokens>:<generation>'
--         (each count '' when unknown) or ''. If that generation is not the store's, the store
--         lost the state the process counted on (FLUSHALL, an empty restart): each day budget
--         is left at most that much (LocalGate::carry_back_day), before the outage's usage is
--         charged; every process that reconciles so tightens it, the most spent view wins
-- ARGV[25] the usage's id (16 hex digits), or '' for none: a usage whose id is among the ids the
--         store charged in the last RC_KEEP ms (at most RC_MOST of them, field 'rc_recent' of
--         KEYS[2]) is not charged again (a reconciliation whose reply was lost, tried again)
-- ARGV[26] n, the number of ids to adopt; ARGV[27 .. 26+n] their ids: permits still in flight
--         here, registered (or re-registered, after a restart with empty data) in the current
--         wave without an admission check, since their calls are already running
-- ARGV[27+n ..] ids to drop: permits that finished during the outage but may still be listed
-- Reply: {wave, state, limit, in_flight, adopted_wave, gen} after the call; adopted permits
-- carry `wave` in NORMAL and the wave before otherwise (see adopt_wave in wave.lua); gen: the
-- generation of the state (written now if the store had none: see `generation` in wave.lua).
local FIRST_ID = CONFIG_ARGS + 9
local RC_KEEP = 600000
local RC_MOST = 512
if #ARGV < FIRST_ID - 1 then return fail('reconcile', 'expected at least ' .. (FIRST_ID - 1) .. ' ARGV, got ' .. #ARGV) end
local config = read_config(1)
local lease = to_int(ARGV[CONFIG_ARGS + 1], 'lease')
local used_requests = to_int(ARGV[CONFIG_ARGS + 2], 'requests used')
local used_tokens = to_int(ARGV[CONFIG_ARGS + 3], 'tokens used')
local began_ago = to_int(ARGV[CONFIG_ARGS + 4], 'outage began ms ago')
local carried_state, carried_limit = string.match(ARGV[CONFIG_ARGS + 5], '^(%u+):(%d+)$')
if ARGV[CONFIG_ARGS + 5] ~= '' and not carried_state then
  return fail('reconcile', 'the carried state must be STATE:limit or empty, got ' .. ARGV[CONFIG_ARGS + 5])
end
local day_carried = ARGV[CONFIG_ARGS + 6]
local carried_requests_day, carried_tokens_day, day_gen = string.match(day_carried, '^(%d*):(%d*):(%d*)$')
if day_carried ~= '' and not carried_requests_day then
  return fail('reconcile', 'the carried day must be <requests>:<tokens>:<generation> or empty, got ' .. day_carried)
end
local lost_day = day_gen and day_gen ~= '' and state_read({ 'gen' })[1] ~= day_gen
local usage_id = ARGV[CONFIG_ARGS + 7]
if usage_id ~= '' and not string.match(usage_id, '^%x%x%x%x%x%x%x%x%x%x%x%x%x%x%x%x$') then
  return fail('reconcile', 'the usage id must be 16 hex digits or empty, got ' .. usage_id)
end
local adopt = to_int(ARGV[CONFIG_ARGS + 8], 'adopt count')
if #ARGV < FIRST_ID - 1 + adopt then return fail('reconcile', 'fewer ids than the adopt count') end
local gen = generation('', true)
local now = now_ms()
rebudget(config, now * 1000) -- a changed rate keeps its budget's units (wave.lua)
ll_apply(config, now)
-- A usage charged already (its id among the recent ones: a reconciliation whose reply was lost,
-- tried again) is not charged again; this one is remembered (RC_KEEP ms, the last RC_MOST ids).
if usage_id ~= '' then
  local kept, seen = {}, false
  for id, at in string.gmatch(redis.call('HGET', KEYS[2], 'rc_recent') or '', '(%x+)@(%d+)') do
    at = tonumber(at)
    if at and at > now - RC_KEEP and at <= now + RC_KEEP then
      if id == usage_id then seen = true end
      table.insert(kept, id .. '@' .. string.format('%.0f', at))
    end
  end
  if seen then
    used_requests, used_tokens = 0, 0
  else
    table.insert(kept, usage_id .. '@' .. string.format('%.0f', now))
    while #kept > RC_MOST do table.remove(kept, 1) end
    redis.call('HSET', KEYS[2], 'rc_recent', table.concat(kept, ';'))
  end
end
if config.requests and used_requests > 0 then
  save_tat('requests_tat', gcra_charge_past(config.requests, load_tat('requests_tat', config.requests, now * 1000), now * 1000, used_requests))
end
if config.tokens and used_tokens > 0 then
  save_tat('tokens_tat', gcra_charge_past(config.tokens, load_tat('tokens_tat', config.tokens, now * 1000), now * 1000, used_tokens))
end
-- A day of a state the store lost is left at most what this process last heard of it.
local function carry_back_day(field, b, left)
  if not lost_day or not b or not left or left == '' then return end
  local carried = gcra_tat_leaving(b, tonumber(left), now * 1000)
  if carried > load_tat(field, b, now * 1000) then save_tat(field, carried) end
end
carry_back_day('requests_day_tat', config.requests_day, carried_requests_day)
carry_back_day('tokens_day_tat', config.tokens_day, carried_tokens_day)
-- The day budgets as used from the latest start the usage's times allow (ChargeStart), in debt if
-- they must (LocalGate::charge).
local began = math.max(now - began_ago, 0) * 1000
if config.requests_day and used_requests > 0 then
  local b = config.requests_day
  save_tat('requests_day_tat', gcra_charge_since(b, load_tat('requests_day_tat', b, now * 1000), began, now * 1000, used_requests))
end
if config.tokens_day and used_tokens > 0 then
  local b = config.tokens_day
  save_tat('tokens_day_tat', gcra_charge_since(b, load_tat('tokens_day_tat', b, now * 1000), began, now * 1000, used_tokens))
end

purge(now)
local s = load_state(config, now)
poll(s, now)
if carried_state then carry_back(s, carried_state, tonumber(carried_limit), config) end
save_state(s, config)
local adopted_wave = adopt_wave()
for i = FIRST_ID, FIRST_ID - 1 + adopt do
  if redis.call('ZADD', KEYS[1], 'GT', now + lease, ARGV[i]) == 1 then pc_change(ARGV[i], 1) end
  redis.call('HSET', KEYS[3], ARGV[i], adopted_wave)
  -- Its mark, if one is left, may refer to a count of grants since lost with the state (the
  -- count lives in KEYS[2], the marks here): an adopted permit has none, as in LocalGate::adopt.
  redis.call('HDEL', KEYS[3], 'm|' .. ARGV[i])
end
for i = FIRST_ID + adopt, #ARGV do
  if redis.call('ZREM', KEYS[1], ARGV[i]) == 1 then pc_change(ARGV[i], -1) end
  redis.call('HDEL', KEYS[3], ARGV[i], 'm|' .. ARGV[i])
end
pc_flush() -- the counts by class and tenant, if kept (wave.lua)
return { s.wave, s.state, s.limit, redis.call('ZCARD', KEYS[1]), adopted_wave, gen }
