-- wave.lua: the wave state machine and permit set shared by every wavegate script.
--
-- Not a script on its own: each script is this file followed by its body (see
-- crates/wavegate-redis/src/scripts.rs), so the machine is written once. It is the Lua twin
-- of wavegate-core's WaveMachine and LocalGate and must pass the same tables
-- (wavegate_core::spec).
--
-- Keys every script receives (all share the upstream's hash tag, e.g. "wavegate:{openai}:..."):
--   KEYS[1]  sorted set of held permits: member = client-chosen permit id, score = lease end (ms)
--   KEYS[2]  hash of the wave state: state, limit, wave, cooldown_until, successes, step, threshold,
--            and the rate budgets' theoretical arrival times, requests_tat and tokens_tat (µs)
--   KEYS[3]  hash of permit id -> wave the permit was issued in, and 'm|<permit id>' -> the
--            count of grants right after it and its time, '<requests>:<tokens>:<ms>' (provider_window.lua)
--   KEYS[4]  sorted set of processes waiting at the limit: member = instance id, score = since (ms)
-- Time is always Redis TIME, in milliseconds.

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- KEYS[2]'s fields as this script run has read them: the first read of any field reads every
-- field a script may need in one HMGET (STATE_FIELDS; a field outside the list is read when
-- first asked for), and every write goes through state_write, which keeps the copy in step. A
-- missing field is `false`, as HMGET answers. (One command instead of one per reader — the
-- state, the generation, the budgets, the learned limits, the provider's windows — per script.)
local STATE_FIELDS = { 'state', 'limit', 'wave', 'cooldown_until', 'successes', 'step', 'threshold', 'base', 'ceiling',
  'good', 'retest_at', 'spacing', 'on_trial', 'rounds', 'retest_rounds', 'gen', 'requests_tat', 'tokens_tat',
  'll_requests_limit', 'll_requests_window', 'll_requests_until', 'll_tokens_limit', 'll_tokens_window',
  'll_tokens_until', 'pw_requests_left', 'pw_requests_until', 'pw_requests_at', 'pw_requests_to', 'pw_requests_rough',
  'pw_requests_base', 'pw_requests_each', 'pw_requests_debt', 'pw_tokens_left', 'pw_tokens_until', 'pw_tokens_at', 'pw_tokens_to', 'pw_tokens_rough',
  'pw_tokens_base', 'pw_tokens_each', 'pw_tokens_debt', 'pw_input_left', 'pw_input_until', 'pw_input_at', 'pw_input_to', 'pw_input_rough',
  'pw_input_base', 'pw_input_each', 'pw_input_debt', 'pw_output_left', 'pw_output_until', 'pw_output_at', 'pw_output_to', 'pw_output_rough',
  'pw_output_base', 'pw_output_each', 'pw_output_debt', 'pw_sent_requests', 'pw_sent_tokens',
  'pw_sent_output', 'pw_sent_back', 'requests_rate',
  'tokens_rate', 'pc', 'turn_instance', 'turn_at', 'turn_line', 'input_tat', 'output_tat', 'input_rate',
  'output_rate', 'requests_day_tat', 'tokens_day_tat', 'requests_day_rate', 'tokens_day_rate', 'll_input_limit',
  'll_input_window', 'll_input_until', 'll_output_limit', 'll_output_window', 'll_output_until' }
local state_cache = nil

-- The values of `fields` of hash `key` (a list, in order; `false` for a missing one), through
-- `cache` (field -> value as read or written in this run): one HMGET, in chunks of 1000 (the
-- Lua stack bounds unpack), for the fields the cache does not have yet.
local function cached_hmget(key, cache, fields)
  local missing = {}
  for _, field in ipairs(fields) do
    if cache[field] == nil then table.insert(missing, field) end
  end
  for from = 1, #missing, 1000 do
    local chunk = { unpack(missing, from, math.min(from + 999, #missing)) }
    local values = redis.call('HMGET', key, unpack(chunk))
    for i, field in ipairs(chunk) do cache[field] = values[i] end
  end
  local out = {}
  for i, field in ipairs(fields) do out[i] = cache[field] end
  return out
end

-- The values of `fields` of KEYS[2] (a list, in order; `false` for a missing one).
local function state_read(fields)
  if state_cache == nil then
    state_cache = {}
    cached_hmget(KEYS[2], state_cache, STATE_FIELDS)
  end
  return cached_hmget(KEYS[2], state_cache, fields)
end

-- HSET KEYS[2] with `...` (field, value, field, value, ...), the copy kept in step.
local function state_write(...)
  redis.call('HSET', KEYS[2], ...)
  if state_cache ~= nil then
    local args = { ... }
    for i = 1, #args, 2 do
      local v = args[i + 1]
      -- As Redis stores it: a Lua number becomes an integer (truncated toward zero).
      if type(v) == 'number' then v = string.format('%.0f', v >= 0 and math.floor(v) or math.ceil(v)) end
      state_cache[args[i]] = tostring(v)
    end
  end
end

-- The permits held, counted by class and tenant (read by the choice of class, priority.lua):
-- the state's field 'pc', '<built at ms>;<total>;<key>=<n>;...' with one key per class and
-- tenant, '<class>|<tag>' ('' for an id without a class, '-' for one without a tenant; '%', ';'
-- and '=' escaped). Once a script with classes has built it, every script that adds or removes
-- a permit keeps it (pc_change, written with the state or by pc_flush), whatever its own
-- configuration; the reader checks it against the permits (ZCARD, the sum of the counts, its
-- age) and counts again from them when it does not match (pc_counts in priority.lua).
local pc = nil -- the parsed field: nil not read yet, false absent or unreadable
local pc_dirty = false

local function pc_hex(c) return string.format('%%%02X', string.byte(c)) end
local function pc_char(h) return string.char(tonumber(h, 16)) end
local function pc_escape(text) return string.find(text, '[%%;=]') and (string.gsub(text, '[%%;=]', pc_hex)) or text end
local function pc_unescape(text) return string.find(text, '%', 1, true) and (string.gsub(text, '%%(%x%x)', pc_char)) or text end

-- The key a permit id is counted under: its class and its tenant tag.
local function pc_key(id)
  local class, rest = string.match(id, '^([^|]*)|(.*)$')
  if class == nil then return '|-' end
  return class .. '|' .. (string.match(rest, '^[^|]*|(.+)$') or '-')
end

-- The field's text parsed: { built, total, sum, counts = { [key] = n } }, or false.
local function pc_parse(text)
  if not text then return false end
  local built, total, rest = string.match(text, '^(%d+);(%d+);(.*)$')
  if not built then return false end
  local parsed = { built = tonumber(built), total = tonumber(total), sum = 0, counts = {} }
  local consumed = 0
  for key, n in string.gmatch(rest, '([^;=]*)=(%d+);') do
    consumed, key, n = consumed + #key + #n + 2, pc_unescape(key), tonumber(n)
    parsed.counts[key], parsed.sum = (parsed.counts[key] or 0) + n, parsed.sum + n
  end
  return consumed == #rest and parsed
end

local function pc_text(p)
  local keys = {}
  for key, n in pairs(p.counts) do if n > 0 then table.insert(keys, key) end end
  table.sort(keys)
  local parts = { p.built .. ';' .. p.total .. ';' }
  for _, key in ipairs(keys) do table.insert(parts, pc_escape(key) .. '=' .. p.counts[key] .. ';') end
  return table.concat(parts)
end

local function pc_load()
  if pc == nil then pc = pc_parse(state_read({ 'pc' })[1]) end
  return pc
end

-- Permit `id` was added (1) or removed (-1): counted when the counts exist.
local function pc_change(id, delta)
  local p = pc_load()
  if not p then return end
  local key = pc_key(id)
  p.counts[key], p.total, p.sum = math.max((p.counts[key] or 0) + delta, 0), math.max(p.total + delta, 0), p.sum + delta
  pc_dirty = true
end

-- The ('pc', text) pair to write with the state, or nothing.
local function pc_pending()
  if not pc_dirty or not pc then return end
  pc_dirty = false
  return 'pc', pc_text(pc)
end

-- Writes the counts if they changed.
local function pc_flush()
  if pc_dirty and pc then state_write(pc_pending()) end
end

local function fail(script, message)
  return redis.error_reply('ERR wavegate ' .. script .. ': ' .. message)
end

local function to_int(value, name)
  local n = tonumber(value)
  if n == nil or n ~= math.floor(n) or n < 0 then
    error({ err = 'ERR wavegate: ' .. name .. ' must be a non-negative integer, got ' .. tostring(value) })
  end
  return n
end

-- One rate budget (GCRA), or nil when `rate` is 0.
local function budget(rate, burst)
  if rate == 0 then return nil end
  if burst < 1 then error({ err = 'ERR wavegate: a budget needs a burst of at least 1' }) end
  local interval = 60000000 / rate
  return { rate = rate, interval = interval, tolerance = burst * interval, burst = burst }
end

-- A budget's two numbers from '<rate>:<burst>', its rate counted per `per` ('minute', 'day');
-- nil for ''.
local function budget_pair(value, name, per)
  if value == '' then return nil end
  local rate, burst = string.match(value, '^(%d+):(%d+)$')
  if not rate then
    error({ err = 'ERR wavegate: ' .. name .. ' must be <per ' .. per .. '>:<burst>, got ' .. tostring(value) })
  end
  return tonumber(rate), tonumber(burst)
end

-- An input or output tokens budget, '<per minute>:<burst>' ('' for none).
local function split_budget(value, name)
  local rate, burst = budget_pair(value, name, 'minute')
  if not rate then return nil end
  return budget(rate, burst)
end

-- How far past its tolerance a day budget's TAT may run (µs): a day of debt
-- (wavegate_core::DAY_MOST_DEBT_US, checked equal by wavegate-redis's tests).
local DAY_MOST_DEBT = 86400000000

-- A requests or tokens per day budget, '<per day>:<burst>' ('' for none): GCRA over a day
-- (wavegate_core::Gcra::daily).
local function day_budget(value, name)
  local rate, burst = budget_pair(value, name, 'day')
  if not rate then return nil end
  if rate == 0 or burst == 0 then error({ err = 'ERR wavegate: ' .. name .. ' needs a rate and a burst of at least 1' }) end
  local interval = 86400000000 / rate
  -- A day of debt may be read back (a usage settled above its reservation), not a minute's.
  return { rate = rate, interval = interval, tolerance = burst * interval, burst = burst, most_debt = DAY_MOST_DEBT }
end

-- An ask's cost: '<tokens>' or '<tokens>:<output>', the output part (the answer's, for the
-- output budget; the rest is the input's) at most the tokens. Returns tokens, output.
local function to_cost(value, name)
  local all, out = string.match(value or '', '^(%d+):(%d+)$')
  if all then
    local tokens = to_int(all, name)
    return tokens, math.min(to_int(out, name), tokens)
  end
  return to_int(value, name), 0
end

-- `percent` of a budget's rate or burst, rounded down, at least 1 (a class's own share:
-- wavegate_core::class_budget::class_share, the same table).
local function class_share(units, percent)
  return math.max(math.floor(units * math.min(percent, 100) / 100), 1)
end

-- Each capped class's own budgets: its share of the upstream's budgets in force (set again
-- once the learned limits have tightened them: ll_apply in learned_limit.lua).
local function set_class_budgets(config)
  for _, class in ipairs(config.classes or {}) do
    if class.share < 100 then
      class.requests, class.tokens = nil, nil
      local r, t = config.requests, config.tokens
      if r then class.requests = budget(class_share(r.rate, class.share), class_share(r.burst, class.share)) end
      if t then class.tokens = budget(class_share(t.rate, class.share), class_share(t.burst, class.share)) end
    end
  end
end

-- The configuration, from CONFIG_ARGS ARGV entries starting at `at`: base limit, probe successes,
-- cooldown ladder (comma-separated ms), min cooldown ms, max cooldown ms, requests per minute,
-- requests burst, tokens per minute, tokens burst (a rate of 0: no such budget), recovery
-- ('seed' or 'adaptive'), the first and the longest re-test spacing in ms and the most rounds
-- between re-tests ('adaptive'), the input and the output tokens budgets ('<per minute>:<burst>',
-- '' for none; not shared among classes), the requests and the tokens per day budgets
-- ('<per day>:<burst>', '' for none; not shared among classes) and the priority classes ('' for
-- none).
-- (The Rust side sends exactly this many: wavegate-redis's calls.rs, whose tests run each script
-- with what it sends, one argument fewer and one more.)
local CONFIG_ARGS = 18
local function read_config(at)
  local config = {
    base = to_int(ARGV[at], 'base limit'),
    probe = to_int(ARGV[at + 1], 'probe successes'),
    ladder = {},
    min_cooldown = to_int(ARGV[at + 3], 'min cooldown'),
    max_cooldown = to_int(ARGV[at + 4], 'max cooldown'),
    retest_after = to_int(ARGV[at + 10], 'retest after'),
    retest_max = to_int(ARGV[at + 11], 'retest max'),
    retest_rounds_max = math.max(to_int(ARGV[at + 12], 'retest rounds max'), 1),
  }
  for step in string.gmatch(ARGV[at + 2], '[^,]+') do
    table.insert(config.ladder, to_int(step, 'cooldown step'))
  end
  config.requests = budget(to_int(ARGV[at + 5], 'requests per minute'), to_int(ARGV[at + 6], 'requests burst'))
  config.tokens = budget(to_int(ARGV[at + 7], 'tokens per minute'), to_int(ARGV[at + 8], 'tokens burst'))
  config.adaptive = ARGV[at + 9] == 'adaptive'
  config.input = split_budget(ARGV[at + 13], 'input tokens budget')
  config.output = split_budget(ARGV[at + 14], 'output tokens budget')
  config.requests_day = day_budget(ARGV[at + 15], 'requests per day budget')
  config.tokens_day = day_budget(ARGV[at + 16], 'tokens per day budget')
  -- Priority classes: '' for none, else 'name:weight:reserve%[:budget%]' joined by ',', the
  -- default class marked with a leading '*' (see priority.lua), and optionally '@<ms>': a permit
  -- counts in its class's share only while its lease ends at least that far ahead (renewed
  -- lately). A class with a budget share below 100 % has budgets of its own, that share of the
  -- upstream's (class_budget.rs; their TATs are 'requests_tat|<class>', 'tokens_tat|<class>').
  config.classes, config.class_index, config.default_class, config.class_window = {}, {}, 1, 0
  for entry in string.gmatch(ARGV[at + 17], '[^,]+') do
    local window = string.match(entry, '^@(%d+)$')
    local default, name, weight, reserve, share = string.match(entry, '^(%*?)([^:@]+):(%d+):(%d+):?(%d*)$')
    if window then
      config.class_window = tonumber(window)
    elseif name == nil then
      error({ err = 'ERR wavegate: bad priority class ' .. entry })
    else
      local class = { name = name, weight = tonumber(weight), reserve = tonumber(reserve), share = tonumber(share) or 100 }
      table.insert(config.classes, class)
      config.class_index[name] = #config.classes
      if default == '*' then config.default_class = #config.classes end
    end
  end
  set_class_budgets(config)
  if not config.adaptive and ARGV[at + 9] ~= 'seed' then
    error({ err = 'ERR wavegate: recovery must be seed or adaptive, got ' .. tostring(ARGV[at + 9]) })
  end
  if config.base < 1 or config.probe < 1 or #config.ladder == 0 then
    error({ err = 'ERR wavegate: base limit, probe successes and the ladder must not be empty or zero' })
  end
  return config
end

local STATES = { NORMAL = true, COOLDOWN = true, PROBE = true, DEGRADED = true }

-- NORMAL at the base limit, wave 1, nothing remembered (WaveMachine::new).
local function fresh_state(config)
  return { state = 'NORMAL', limit = config.base, wave = 1, cooldown_until = 0, successes = 0, step = 0,
           threshold = config.base, ceiling = 0, good = 0, retest_at = 0, spacing = 0, rounds = 0,
           retest_rounds = 0, on_trial = false }
end

-- The base limit the state was saved under (`stored_base`, nil for none) against the one sent
-- (a configured or live change of the limit): NORMAL, or a limit at the old base, follows it;
-- what was learned below it is kept, clamped to it (WaveMachine::rebase, spec::rebase_cases).
local function rebase(s, stored_base, config)
  if stored_base and stored_base ~= config.base and (s.state == 'NORMAL' or s.limit == stored_base) then
    s.limit = config.base
  end
  s.limit = math.max(1, math.min(s.limit, config.base))
  s.threshold = math.max(1, math.min(s.threshold, config.base))
  s.ceiling = math.min(s.ceiling, config.base)
  s.good = math.min(s.good, config.base)
end

-- Reads the state; a missing or unreadable hash starts over in NORMAL at the base limit. The
-- deadlines are clamped to what they may mean at `now`: a cooldown ends at most max_cooldown
-- ahead, a re-test at most retest_max ahead (a backward jump of TIME cannot stall them).
local function load_state(config, now)
  local v = state_read({ 'state', 'limit', 'wave', 'cooldown_until', 'successes', 'step', 'threshold',
    'base', 'ceiling', 'good', 'retest_at', 'spacing', 'on_trial', 'rounds', 'retest_rounds' })
  local s = {
    state = v[1],
    limit = tonumber(v[2]),
    wave = tonumber(v[3]),
    cooldown_until = tonumber(v[4]),
    successes = tonumber(v[5]),
    step = tonumber(v[6]),
    threshold = tonumber(v[7]),
    ceiling = tonumber(v[9]) or 0,
    good = tonumber(v[10]) or 0,
    retest_at = tonumber(v[11]) or 0,
    spacing = tonumber(v[12]) or 0,
    on_trial = v[13] == '1',
    rounds = tonumber(v[14]) or 0,
    retest_rounds = tonumber(v[15]) or 0,
  }
  if not STATES[s.state] or not s.limit or not s.wave or not s.cooldown_until
      or not s.successes or not s.step or not s.threshold then
    if v[1] then
      redis.log(redis.LOG_WARNING, 'wavegate: unreadable wave state in ' .. KEYS[2] .. ', starting over')
    end
    return fresh_state(config)
  end
  rebase(s, tonumber(v[8]), config)
  local cooldown_most, retest_most = now + config.max_cooldown, now + math.max(config.retest_max, config.retest_after)
  if s.cooldown_until > cooldown_most or s.retest_at > retest_most then
    -- Saved at once, so the clamped deadline stays put rather than moving with now.
    s.cooldown_until = math.min(s.cooldown_until, cooldown_most)
    s.retest_at = math.min(s.retest_at, retest_most)
    state_write('cooldown_until', s.cooldown_until, 'retest_at', s.retest_at)
  end
  return s
end

local function save_state(s, config)
  state_write('state', s.state, 'limit', s.limit, 'wave', s.wave,
    'cooldown_until', s.cooldown_until, 'successes', s.successes, 'step', s.step, 'threshold', s.threshold,
    'base', config.base, 'ceiling', s.ceiling, 'good', s.good, 'retest_at', s.retest_at, 'spacing', s.spacing,
    'on_trial', s.on_trial and 1 or 0, 'rounds', s.rounds, 'retest_rounds', s.retest_rounds, pc_pending())
end

-- COOLDOWN past its deadline becomes PROBE at limit 1. Returns true when it changed.
local function poll(s, now)
  if s.state == 'COOLDOWN' and now >= s.cooldown_until then
    s.successes = 0
    s.state = 'PROBE'
    s.limit = 1
    return true
  end
  return false
end

-- Why the wave refuses one more permit with `in_flight` held, and for how long (ms), or nil
-- when it admits (WaveMachine::admit, after poll).
local function wave_denial(s, now, in_flight)
  if s.state == 'COOLDOWN' then return 'cooldown', math.max(0, s.cooldown_until - now) end
  if in_flight >= s.limit then return 'at_limit', 0 end
  return nil
end

-- 'adaptive' in NORMAL or DEGRADED: what held, slow start, growth only when used, the ceiling
-- and its re-tests (WaveMachine::adaptive_success).
local function adaptive_success(s, wave, in_flight, now, config)
  if wave ~= s.wave then return nil end
  s.on_trial = false
  if in_flight * 2 < s.limit then return nil end
  s.successes = s.successes + 1
  if s.successes < s.limit then return nil end
  -- A round: as many successes as the limit, while it was used.
  s.successes = 0
  s.rounds = s.rounds + 1
  if in_flight >= s.limit then
    -- It held, fully used.
    s.good = math.max(s.good, s.limit)
  end
  if s.ceiling > 0 and s.limit >= s.ceiling then
    -- The limit that drew the last step back held this time: the capacity grew.
    s.ceiling = 0
    s.spacing = 0
    s.retest_rounds = 0
  end
  if s.state == 'NORMAL' then return nil end
  local next_limit
  if s.limit < s.threshold then next_limit = math.min(s.limit * 2, s.threshold) else next_limit = s.limit + 1 end
  if s.ceiling > 0 and next_limit >= s.ceiling then
    -- Test the ceiling again only once its spacing has passed, in time and in rounds.
    if now >= s.retest_at and s.rounds >= s.retest_rounds then next_limit = s.ceiling
    else next_limit = s.ceiling - 1 end
  end
  next_limit = math.max(math.min(next_limit, config.base), s.limit)
  if next_limit == s.limit then return nil end
  s.limit = next_limit
  if s.limit >= config.base then
    -- Back at the base limit; a ceiling there is forgotten only once a round holds.
    s.state = 'NORMAL'
    s.step = 0
  end
  return 'DEGRADED'
end

-- A success of a permit issued in `wave` at `now`, with `in_flight` permits held at the report
-- (the reporting one included). Returns the state left, or nil when nothing changed.
local function on_success(s, wave, in_flight, now, config)
  if config.adaptive and (s.state == 'DEGRADED' or s.state == 'NORMAL') then
    return adaptive_success(s, wave, in_flight, now, config)
  end
  if wave ~= s.wave then return nil end
  if s.state == 'PROBE' then
    s.successes = s.successes + 1
    if s.successes < config.probe then return nil end
    s.successes = 0
    s.limit = math.min(2, config.base)
    if s.limit >= config.base then
      s.state = 'NORMAL'
      s.step = 0
    else
      s.state = 'DEGRADED'
    end
    return 'PROBE'
  elseif s.state == 'DEGRADED' then
    s.successes = s.successes + 1
    if s.successes < s.limit then return nil end
    s.successes = 0
    s.limit = math.min(s.limit * 2, config.base)
    if s.limit >= config.base then
      s.state = 'NORMAL'
      s.step = 0
    end
    return 'DEGRADED'
  end
  return nil
end

-- A 429 of a permit issued in `wave`. Returns 'cut' (with the limit before) or 'late'. A cut
-- that leaves the state out of COOLDOWN is an 'adaptive' step back: nothing stops
-- (WaveMachine::on_rate_limited).
local function on_rate_limited(s, wave, now, retry_after_ms, config)
  poll(s, now)
  if wave ~= s.wave then return 'late', s.limit end
  local from = s.limit
  s.wave = s.wave + 1
  s.successes = 0
  if config.adaptive and (s.state == 'NORMAL' or s.state == 'DEGRADED') and s.limit > s.good
      and not s.on_trial then
    -- A test above what held went too far: back to what held (or half, when nothing is known
    -- yet); the rejected call alone waits; test again later, and later still after each
    -- failed test.
    s.ceiling = s.limit
    if s.good > 0 then s.limit = s.good else s.limit = math.max(1, math.floor(s.limit / 2)) end
    s.threshold = s.limit
    s.state = 'DEGRADED'
    if s.spacing == 0 then
      s.spacing = config.retest_after
      s.retest_rounds = 1
    else
      s.spacing = math.min(s.spacing * 2, config.retest_max)
      s.retest_rounds = math.min(s.retest_rounds * 2, config.retest_rounds_max)
    end
    s.retest_at = now + s.spacing
    s.rounds = 0
    s.on_trial = true
    return 'cut', from
  end
  -- The ladder climbs with each stop before NORMAL, unless a limit held since the last one (the
  -- provider took a full load again: this stop is a first one).
  if s.state == 'NORMAL' or (config.adaptive and s.good > 0) then s.step = 0 else s.step = s.step + 1 end
  s.limit = math.max(1, math.floor(s.limit / 2))
  s.threshold = s.limit
  s.state = 'COOLDOWN'
  s.ceiling = 0
  s.good = 0
  s.spacing = 0
  s.retest_at = 0
  s.rounds = 0
  s.retest_rounds = 0
  s.on_trial = false
  local cooldown
  if retry_after_ms then
    cooldown = math.max(config.min_cooldown, math.min(retry_after_ms, config.max_cooldown))
  else
    cooldown = math.min(config.ladder[math.min(s.step + 1, #config.ladder)], config.max_cooldown)
  end
  s.cooldown_until = now + cooldown
  return 'cut', from
end

-- GCRA with a cost, in microseconds; the same operations in the same order as
-- wavegate-core's gcra.rs, so both compute the same numbers.
-- Returns the new TAT, or nil and the wait in ms.
local function gcra_check(b, tat, now, cost)
  local new_tat = math.floor(math.max(tat, now) + cost * b.interval)
  local ahead = new_tat - now
  if ahead > b.tolerance then return nil, math.ceil((ahead - b.tolerance) / 1000) end
  return new_tat, 0
end

-- Settles a reservation: `delta` more units than reserved (negative: a refund).
local function gcra_settle(b, tat, now, delta)
  if delta >= 0 then return math.floor(math.max(tat, now) + delta * b.interval) end
  return math.max(math.max(math.floor(tat + delta * b.interval), 0), math.min(tat, now))
end

-- Adds `units` used elsewhere.
local function gcra_charge(b, tat, now, units)
  return math.floor(math.max(tat, now) + units * b.interval)
end

-- Adds `units` used elsewhere in the past (an outage, at most at the rate): they leave the
-- budget empty at most, never in debt for the time they took (Gcra::charge_past).
local function gcra_charge_past(b, tat, now, units)
  return math.min(gcra_charge(b, tat, now, units), math.max(tat, math.floor(now + b.tolerance)))
end

-- Adds `units` used elsewhere since `began` (an outage's start) to a day budget: as if charged
-- then, in debt for what the refill since did not pay, a day of it at most (Gcra::charge_since).
local function gcra_charge_since(b, tat, began, now, units)
  return math.min(gcra_charge(b, tat, math.min(began, now), units), math.max(tat, math.floor(now + b.tolerance) + b.most_debt))
end

-- The TAT that leaves `remaining` units available at `now` (Gcra::tat_leaving).
local function gcra_tat_leaving(b, remaining, now)
  return math.floor(now + math.max(b.burst - remaining, 0) * b.interval)
end

-- The units available now, and the ms until one more is (0 when full).
local function gcra_remaining(b, tat, now)
  local used = math.max(tat - now, 0)
  local remaining = math.min(math.max(math.floor((b.tolerance - used) / b.interval), 0), b.burst)
  if remaining >= b.burst then return remaining, 0 end
  local next_us = used - (b.tolerance - (remaining + 1) * b.interval)
  return remaining, math.ceil(math.max(next_us, 0) / 1000)
end

-- How long a process stays on the waiting list without asking again (ms;
-- wavegate_core::WAITING_TTL_MS, checked equal by wavegate-redis's tests).
local WAITING_TTL = 10000

-- How far past a budget's tolerance a TAT read back may lie (µs): a minute of debt (usage
-- settled above its reservation). Anything later (a backward jump of TIME, a value written by
-- hand) is read as that. A day budget allows a day of debt (`most_debt`, day_budget).
local TAT_MOST_DEBT = 60000000

-- A budget's TAT as stored, clamped to what it may mean at `now` (µs); a clamped TAT is saved,
-- so it stays put rather than moving with now.
local function load_tat(field, b, now)
  local tat = tonumber(state_read({ field })[1]) or 0
  if tat ~= tat or tat < 0 then return 0 end
  local most = math.floor(now + b.tolerance + (b.most_debt or TAT_MOST_DEBT))
  if tat > most then
    state_write(field, string.format('%.0f', most))
    return most
  end
  return tat
end

local function save_tat(field, tat)
  state_write(field, string.format('%.0f', tat))
end

-- What is left of the day budgets at `now` (µs), '<requests>:<tokens>' (each '' without its
-- budget), or nil without a day budget: acquire replies it after the generation (granted or
-- denied), and a process's fallback starts its day shares from it (wavegate_core::DayLeft).
local function day_left(config, now)
  if not (config.requests_day or config.tokens_day) then return nil end
  local function left(b, field)
    if not b then return '' end
    local remaining = gcra_remaining(b, load_tat(field, b, now), now)
    return string.format('%.0f', remaining)
  end
  return left(config.requests_day, 'requests_day_tat') .. ':' .. left(config.tokens_day, 'tokens_day_tat')
end

-- A budget's TAT carried across a change of its rate from `from` to `to` a minute: the units it
-- holds stay the same, so the budget is neither reset nor given a second burst; a TAT not after
-- `now` or a rate of 0 is kept (wavegate_core::rescale_tat, spec::rescale_cases).
local function rescale_tat(tat, now, from, to)
  if tat <= now or from == to or from == 0 or to == 0 then return tat end
  return now + math.floor((tat - now) * from / to)
end

-- The configured rates the budgets' TATs were last saved under ('requests_rate', 'tokens_rate',
-- 'input_rate', 'output_rate', 'requests_day_rate', 'tokens_day_rate' in KEYS[2]) against the ones sent (a live change of a rate, a
-- rolling deploy): every TAT of a budget whose rate changed, the upstream's and each capped
-- class's, is rescaled
-- (LocalGate::set_budgets). `now` in µs. Before ll_apply: the configured rates.
local function rebudget(config, now)
  local stored = state_read({ 'requests_rate', 'tokens_rate', 'input_rate', 'output_rate', 'requests_day_rate',
    'tokens_day_rate' })
  for i, kind in ipairs({ 'requests', 'tokens', 'input', 'output', 'requests_day', 'tokens_day' }) do
    local rate = config[kind] and config[kind].rate or 0
    local was = tonumber(stored[i])
    if was ~= rate and not (was == nil and rate == 0) then
      if was and was > 0 and rate > 0 then
        local function rescale(field, from, to)
          local tat = tonumber(state_read({ field })[1])
          if tat then save_tat(field, rescale_tat(tat, now, from, to)) end
        end
        rescale(kind .. '_tat', was, rate)
        for _, class in ipairs(config.classes) do
          if class.share < 100 then
            rescale(kind .. '_tat|' .. class.name, class_share(was, class.share), class_share(rate, class.share))
          end
        end
      end
      state_write(kind .. '_rate', rate)
    end
  end
end

-- The wave an adopted permit (a call already running) reports against: the current one in
-- NORMAL, otherwise the one before, so its 429 is late and its success does not count.
-- Reads the state without a config (renew has none): a missing state is wave 1, NORMAL.
local function adopt_wave()
  local v = state_read({ 'state', 'wave' })
  local wave = tonumber(v[2]) or 1
  if v[1] == 'NORMAL' or v[1] == false or v[1] == nil then return wave end
  return math.max(wave - 1, 0)
end

-- Drops the permits whose lease ended at or before `now`, with their wave tags.
local function purge(now)
  local expired = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now)
  if #expired > 0 then
    redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
    for i = 1, #expired, 500 do
      local fields = {}
      for k = i, math.min(i + 499, #expired) do
        table.insert(fields, expired[k])
        table.insert(fields, 'm|' .. expired[k])
      end
      redis.call('HDEL', KEYS[3], unpack(fields))
    end
    for _, id in ipairs(expired) do pc_change(id, -1) end
    pc_flush()
  end
  return #expired
end

-- The generation of this upstream's state: a field of KEYS[2] written once, at first use (Redis
-- TIME in µs). A process sends the one it last saw ('' before it has seen one). If the state
-- holds none or another one, the state it counted on is gone (FLUSHALL, an eviction, an empty
-- restart without a dropped connection): the script answers WAVEGATE_LOST before it changes
-- anything, and the process handles it as an empty restart (its fallback share, then a
-- reconciliation that registers its permits again) instead of being granted against an empty
-- set. With `create`, a caller that has seen none writes one when there is none. Returns the
-- generation in force ('' for none), or nil when the caller's is gone.
local function generation(expected, create)
  local gen = state_read({ 'gen' })[1]
  if expected ~= '' then
    if gen ~= expected then return nil end
    return gen
  end
  if not gen and create then
    local t = redis.call('TIME')
    gen = t[1] .. string.format('%06d', tonumber(t[2]))
    state_write('gen', gen)
  end
  return gen or ''
end

local function state_lost(script)
  return redis.error_reply('WAVEGATE_LOST ' .. script ..
    ": this upstream's state is gone (FLUSHALL, an eviction or an empty restart)")
end

-- After the store forgot the state: a recovery in progress that a process last saw (`state` at
-- `limit`) goes back into a state that looks forgotten (NORMAL at the base limit in wave 1), so
-- a stepped-back limit stays stepped back (WaveMachine::carry_back, spec::carry_back_cases).
local function carry_back(s, state, limit, config)
  local forgotten = s.state == 'NORMAL' and s.wave == 1 and s.limit == config.base
  if not forgotten or (state ~= 'PROBE' and state ~= 'DEGRADED') or limit >= config.base then return false end
  s.state = state
  s.limit = math.max(limit, 1)
  s.threshold = s.limit
  s.successes = 0
  return true
end
