-- learned_limit.lua: limits the provider announced, learned; they tighten the configured budgets.
--
-- Not a script on its own: concatenated after wave.lua and provider_window.lua into every
-- upstream script (see crates/wavegate-redis/src/scripts.rs). The Lua twin of wavegate-core's
-- LearnedBudgets (crates/wavegate-core/src/learned_limit.rs); both pass the "learned limit"
-- cases of wavegate_core::spec.
--
-- Fields of the wave state hash (KEYS[2]): ll_requests_limit, ll_requests_window (ms),
-- ll_requests_until (ms of Redis TIME: forgotten from then on), and the same for tokens, input
-- and output (Anthropic's input and output tokens limits, tightening the input and output
-- budgets).
--
-- Rules:
--   * a limit L per window W (ms) is a budget of floor(L * 60000 / W) a minute (at least 1)
--     with bursts of up to L, both at most 2^32 - 1;
--   * the budget in force is the tighter of the configured and the learned one in rate and in
--     burst, or the learned one alone when none is configured: never looser than configured;
--   * the latest report replaces the limit kept; it is kept LL_KEPT_WINDOWS windows after it;
--   * a capped class's own budgets are its share of the budgets in force, not the configured.

local LL_KEPT_WINDOWS = 3
local LL_MAX = 4294967295
local LL_NAMES = { 'requests', 'tokens', 'input', 'output' }

-- The per-minute rate and the burst of a limit of `limit` per `window` ms (LearnedLimit::budget).
local function ll_budget(limit, window)
  limit = math.max(1, math.min(limit, LL_MAX))
  window = math.max(1, window)
  local per_minute = math.max(1, math.min(math.floor(limit * 60000 / window), LL_MAX))
  return per_minute, limit
end

-- The tighter of budget `b` (or nil: none configured) and a learned rate and burst.
local function ll_tightest(b, rate, burst)
  if b == nil then return budget(rate, burst) end
  return budget(math.min(b.rate, rate), math.min(b.burst, burst))
end

-- Puts the budgets in force at `now` into config.requests, config.tokens, config.input and
-- config.output, and the capped classes' shares of them into theirs. An end read back lies at
-- most LL_KEPT_WINDOWS windows after now (a backward jump of TIME, a hand): a later one is saved
-- as that.
local function ll_apply(config, now)
  local fields = {}
  for _, name in ipairs(LL_NAMES) do
    for _, part in ipairs({ '_limit', '_window', '_until' }) do table.insert(fields, 'll_' .. name .. part) end
  end
  local v = state_read(fields)
  for i, name in ipairs(LL_NAMES) do
    local limit, window, ends = tonumber(v[3 * i - 2]), tonumber(v[3 * i - 1]), tonumber(v[3 * i])
    if limit and window and ends and now < ends then
      local most = now + math.max(1, window) * LL_KEPT_WINDOWS
      if ends > most then
        state_write('ll_' .. name .. '_until', string.format('%.0f', most))
      end
      local rate, burst = ll_budget(limit, window)
      config[name] = ll_tightest(config[name], rate, burst)
    end
  end
  set_class_budgets(config)
end

-- Keeps a limit of `limit` per `window` ms announced at `now` for `name` (one of LL_NAMES).
local function ll_report(now, name, limit, window)
  if limit < 1 or window < 1 then return end
  state_write('ll_' .. name .. '_limit', string.format('%.0f', limit),
    'll_' .. name .. '_window', string.format('%.0f', window),
    'll_' .. name .. '_until', string.format('%.0f', now + window * LL_KEPT_WINDOWS))
end

-- The limits kept at `now`, for the status: per name of LL_NAMES (requests, tokens, input,
-- output), limit, window and ms until forgotten (-1, -1, -1 when none).
local function ll_status(now)
  local out = {}
  for _, name in ipairs(LL_NAMES) do
    local v = state_read({ 'll_' .. name .. '_limit', 'll_' .. name .. '_window', 'll_' .. name .. '_until' })
    local limit, window, ends = tonumber(v[1]), tonumber(v[2]), tonumber(v[3])
    if limit and window and ends and now < ends then
      table.insert(out, limit)
      table.insert(out, window)
      table.insert(out, ends - now)
    else
      table.insert(out, -1)
      table.insert(out, -1)
      table.insert(out, -1)
    end
  end
  return out
end
