-- provider_window.lua: the provider's announced windows, "R left until T", kept for the fleet.
--
-- Not a script on its own: concatenated after wave.lua into every upstream script (see
-- crates/wavegate-redis/src/scripts.rs). The Lua twin of wavegate-core's ProviderWindows
-- (crates/wavegate-core/src/provider_window.rs); both pass the "provider window" cases of
-- wavegate_core::spec.
--
-- Fields of the wave state hash (KEYS[2]): pw_requests_left, pw_requests_until,
-- pw_tokens_left, pw_tokens_until (ms of Redis TIME; an end of 0 or in the past: no window).
--
-- Rules:
--   * a report of R left with a reset in D (at most PW_MAX_RESET ms: a day), with N other calls
--     in flight (each assumed to cost one request and as many tokens as the reporting call
--     reserved): R - cost(N) is left, until now + D; a report of the same window (ending within
--     PW_SAME_WINDOW ms of the known end) only lowers what is left, a later window replaces it,
--     and so does an earlier one (an older answer's end only ever lies later: an earlier end
--     is the provider's newer word);
--   * what is left is at most PW_MOST_LEFT; an end read back lies at most PW_MAX_RESET ms after now (a backward jump of TIME, a
--     value written by hand): no window outlives its clamp;
--   * a grant costs one request and its token estimate while a window runs;
--   * while a window runs with less left than a grant needs, grants wait until its end; a spent
--     tokens window refuses even a grant that reserves no tokens.

local PW_SAME_WINDOW = 1000
local PW_MAX_RESET = 86400000
local PW_MOST_LEFT = 1000000000000000
local PW_NAMES = { 'requests', 'tokens' }

-- A stored number as what it may mean: an integer in [0, most], 0 when unreadable.
local function pw_clamp(value, most)
  local n = tonumber(value)
  if n == nil or n ~= n or n < 0 then return 0 end
  return math.floor(math.min(n, most))
end

local function pw_save(w)
  redis.call('HSET', KEYS[2],
    'pw_requests_left', string.format('%.0f', w.requests.left), 'pw_requests_until', string.format('%.0f', w.requests['until']),
    'pw_tokens_left', string.format('%.0f', w.tokens.left), 'pw_tokens_until', string.format('%.0f', w.tokens['until']))
end

-- The windows as stored, clamped to what they may mean at `now`; a clamped end is saved, so it
-- stays put rather than moving with now.
local function pw_load(now)
  local v = redis.call('HMGET', KEYS[2], 'pw_requests_left', 'pw_requests_until', 'pw_tokens_left', 'pw_tokens_until')
  local last = now + PW_MAX_RESET
  local w = {
    requests = { left = pw_clamp(v[1], PW_MOST_LEFT), ['until'] = pw_clamp(v[2], last) },
    tokens = { left = pw_clamp(v[3], PW_MOST_LEFT), ['until'] = pw_clamp(v[4], last) },
  }
  if (tonumber(v[2]) or 0) > last or (tonumber(v[4]) or 0) > last then pw_save(w) end
  return w
end

-- How long a grant reserving `tokens` must wait, or nil when no window refuses it.
local function pw_wait(w, now, tokens)
  local need = { requests = 1, tokens = math.max(tokens, 1) }
  local wait = nil
  for _, name in ipairs(PW_NAMES) do
    local t = w[name]
    if now < t['until'] and t.left < need[name] then
      wait = math.max(wait or 0, t['until'] - now)
    end
  end
  return wait
end

-- Counts a grant reserving `tokens` down from the running windows (saved by the caller).
local function pw_charge(w, now, tokens)
  local cost = { requests = 1, tokens = tokens }
  local changed = false
  for _, name in ipairs(PW_NAMES) do
    local t = w[name]
    if now < t['until'] then
      t.left = math.max(0, t.left - cost[name])
      changed = true
    end
  end
  return changed
end

-- Takes in one window's report: `remaining` left, resetting in `reset_ms`, `others_cost` spent
-- by the calls still in flight.
local function pw_report_one(t, now, remaining, reset_ms, others_cost)
  if reset_ms == 0 then return end
  local ends = now + math.min(reset_ms, PW_MAX_RESET)
  local estimate = math.max(0, math.min(remaining, PW_MOST_LEFT) - others_cost)
  if now < t['until'] and math.abs(ends - t['until']) <= PW_SAME_WINDOW then
    t.left = math.min(t.left, estimate)
    t['until'] = math.max(t['until'], ends)
  else
    t.left = estimate
    t['until'] = ends
  end
end
