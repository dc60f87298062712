-- finish.lua: release a permit by id (idempotent) and report its outcome for its wave.
--
-- KEYS[1] permits (zset)   KEYS[2] wave state (hash)   KEYS[3] permit waves (hash)
-- KEYS[4] processes waiting at the limit (zset: since when)
-- KEYS[5] the same processes (zset: when each last asked); one that has not asked for
--         WAITING_TTL is taken off both, one that keeps asking keeps its place however long
-- KEYS[6] how many callers of each waiting process wait, by class, and the fleet's counts
--         (hash; classes only: priority.lua, fleet.lua)
-- KEYS[7] the waiting members of each class and tenant in order (zset; classes only: fleet.lua)
-- KEYS[8] the calls the provider served lately in shadow mode, fleet-wide (zset: member
--         '<went ms>:<s|r>:<permit id>', served or not, score the end in ms; record_went below)
-- ARGV[1..18] config (see read_config in wave.lua)
-- ARGV[19] permit id
-- ARGV[20] the wave the permit was issued in
-- ARGV[21] outcome: 'success', 'rate_limited', 'neutral', or 'served:<n>': a success while the
--          provider served at most n calls at once, counted with no more permits in flight than
--          that (shadow mode: the permits held are ghosts'; WaveSignal::ServedSuccess); or
--          'served:<n>:<went>:<ended>' with the call's span in Unix ms (the clock TIME reads): n is
--          then at least the fleet's served calls beside it (served_beside); 'went:<s|r>:<went>:
--          <ended>': the call of the id (in shadow, a pass's: not held) was at the provider then,
--          served or not, recorded for the fleet's counts (record_went; WaveSignal::Went),
--          nothing to learn; or
--          'rate_limited_among:<went>:<ended>': a 429 of a call in shadow in a fleet, taken as
--          'rate_limited' only when no more calls were at the provider at once while it ran, itself
--          included, than the limit (met_at_once), as 'neutral' otherwise (WaveSignal::RateLimitedAmong)
-- ARGV[22] Retry-After in ms for a 429, or '' when the provider gave none
-- ARGV[23] the text before the instance id of the wake-up channels ('<prefix>:{wake:'), or ''
--          for no announcement: when a permit is freed, the name of the upstream (the hash tag
--          of KEYS[1]) is published on the channel of the process that has waited longest at
--          the limit only, '<prefix>:{wake:<instance>}:released' (taken off the list), so one
--          process asks, not all, and no other process receives anything; nothing is published
--          when nobody waits. With priority classes it is the process the fleet-wide choice of
--          class reaches (priority.lua), and it keeps its place until it is granted
-- ARGV[24] tokens used beyond the reservation (negative: a refund), settled on the tokens budget:
--          '<delta>', or '<delta>:<output delta>' with the answer's part, settled on the output
--          budget (the rest on the input budget); then ':refused' for a call the provider
--          refused (a 429) whose answer had no report: the provider's windows take its whole
--          reservation back (pw_refuse), the deltas being minus what it reserved; or ':kept' for
--          one whose answer's report gave it back already: the windows take nothing back
--          (otherwise the output given back returns to the output window)
-- ARGV[25] the generation of the state the process last saw, '' for none (see `generation` in
--          wave.lua: if it is gone, WAVEGATE_LOST and nothing is written)
-- ARGV[26] the hand-off (hand_off below): 'all' (whether or not the woken process hears its
--          wake-up: the Rust twin's rule), 'heard' (only when the wake-up reached at least one
--          subscriber: one server, where PUBLISH counts them), or 'none' (a Cluster, where PUBLISH
--          counts only its own node's subscribers)
-- ARGV[27..50] optional: what the call's answer said of the provider's windows, taken in before
--          anything else, as report_window.lua would have just before this release (the same
--          24 arguments, window_report.lua): one round trip per answer, not two
-- Reply: {held, effect, limit_before, limit, wave, state, cooldown_ms, changed_from, in_flight,
--         woken, handed}
--   held: 1 if the id was held; effect: 'cut', 'late' or 'none';
--   changed_from: the state a success moved the machine out of, or '';
--   woken: the instance id of the process woken on its channel (ARGV[23]), or '' for none;
--   handed: the permit granted to it in this release (hand_off below), or '' for none. The
--   wake-up then carries the grant: '<upstream> <wave> <state> <limit> <id>', the upstream
--   alone otherwise.
-- (wavegate_core::LocalGate::finish is the Rust twin.)
local reported = #ARGV == CONFIG_ARGS + 8 + REPORT_ARGS
if #ARGV ~= CONFIG_ARGS + 8 and not reported then
  return fail('finish', 'expected ' .. (CONFIG_ARGS + 8) .. ' ARGV, or ' .. REPORT_ARGS .. ' more with a report, got ' .. #ARGV)
end
local config = read_config(1)
local id = ARGV[CONFIG_ARGS + 1]
local wave = to_int(ARGV[CONFIG_ARGS + 2], 'wave')
local outcome = ARGV[CONFIG_ARGS + 3]
local retry_after = nil
if ARGV[CONFIG_ARGS + 4] ~= '' then retry_after = to_int(ARGV[CONFIG_ARGS + 4], 'retry after') end
local channel = ARGV[CONFIG_ARGS + 5]
local delta_arg = ARGV[CONFIG_ARGS + 6]
local deltas, windows_back = string.match(delta_arg, '^(.-):(%a+)$')
if windows_back ~= nil and windows_back ~= 'refused' and windows_back ~= 'kept' then deltas = nil end
deltas = deltas or delta_arg
local total_text, output_text = string.match(deltas, '^(-?%d+):(-?%d+)$')
local token_delta, output_delta = tonumber(total_text or deltas), tonumber(output_text or '0')
if token_delta == nil or token_delta ~= math.floor(token_delta) or output_delta == nil then
  return fail('finish', 'token delta must be an integer, <integer>:<integer>, or that with :refused or :kept, got '
    .. tostring(delta_arg))
end
if not generation(ARGV[CONFIG_ARGS + 7], false) then return state_lost('finish') end
local hand_off_rule = ARGV[CONFIG_ARGS + 8]
if hand_off_rule ~= 'all' and hand_off_rule ~= 'heard' and hand_off_rule ~= 'none' then
  return fail('finish', 'the hand-off rule must be all, heard or none, got ' .. tostring(hand_off_rule))
end
local now = now_ms()
if reported then take_window_report(CONFIG_ARGS + 8, now) end
-- A refused call's reservation goes back to every provider window (ProviderWindows::refuse),
-- unless its answer's report gave it back ('kept'); otherwise output given back goes back to the
-- output window (ProviderWindows::give_back).
if windows_back == 'refused' then
  -- Once: a permit no longer held was given back at its first finish.
  if redis.call('ZSCORE', KEYS[1], id) then
    pw_refuse(math.max(0, -token_delta), math.max(0, -output_delta), redis.call('HGET', KEYS[3], 'm|' .. id), now)
  end
elseif windows_back == nil and output_delta < 0 then
  pw_give_back(-output_delta, now)
end
rebudget(config, now * 1000) -- a changed rate keeps its budget's units (wave.lua)
ll_apply(config, now)
if config.tokens and token_delta ~= 0 then
  save_tat('tokens_tat', gcra_settle(config.tokens, load_tat('tokens_tat', config.tokens, now * 1000), now * 1000, token_delta))
  settle_class(config, id, now, token_delta)
end
-- The input and output parts on their own budgets (LocalGate::finish).
local function settle_part(name, delta)
  local b = config[name]
  if b and delta ~= 0 then
    save_tat(name .. '_tat', gcra_settle(b, load_tat(name .. '_tat', b, now * 1000), now * 1000, delta))
  end
end
settle_part('input', token_delta - output_delta)
settle_part('output', output_delta)
-- The tokens per day as the tokens per minute (LocalGate::finish).
settle_part('tokens_day', token_delta)

-- The longest lease a handed permit gets (a day; HANDED_LEASE_MAX_MS in LocalGate::hand_off).
local HANDED_LEASE_MAX = 86400000

-- The hand-off (LocalGate::hand_off): the permit just freed goes to the ask `member` (a process
-- without classes, just taken off the waiting list) last made at the limit, as its acquire
-- would have granted it, so the woken process needs no acquire of its own. Only where nothing
-- but the wave decides: no rate or day budget in force; the wave, the provider's windows and
-- the budgets' turn must admit it; an id already held is not granted twice. Returns the ask
-- (granted by hand_over once the wake-up is out), or nil: the process is woken and asks, as
-- without a hand-off.
local function hand_off(member, config, s, now)
  local field = 'h:' .. member
  local head = redis.call('HGET', KEYS[6], field)
  if not head then return nil end
  redis.call('HDEL', KEYS[6], field)
  local lease, tokens, output, id = string.match(head, '^(%d+) (%d+) (%d+) (.+)$')
  lease, tokens, output = tonumber(lease), tonumber(tokens), tonumber(output)
  if not id or not lease or not tokens or not output then return nil end
  -- Clamped to what it may mean: a lease of at most a day, an output part of the tokens.
  lease, output = math.min(math.max(lease, 1), HANDED_LEASE_MAX), math.min(output, tokens)
  if config.requests or config.tokens or config.input or config.output or config.requests_day
    or config.tokens_day then return nil end
  if redis.call('HGET', KEYS[3], id) then return nil end
  if wave_denial(s, now, redis.call('ZCARD', KEYS[1])) then return nil end
  local windows = pw_load(now)
  if pw_wait(windows, now, tokens, output) or budget_turn_wait(member, now) then return nil end
  return { member = member, id = id, lease = lease, tokens = tokens, output = output, windows = windows }
end

-- Grants the ask hand_off chose.
local function hand_over(ask, s, now)
  budget_turn_granted(ask.member, now)
  pw_grant(ask.windows, now, ask.id, s.wave, ask.lease, ask.tokens, ask.output)
end

-- Shadow mode's record of the calls at the provider, fleet-wide (KEYS[8]; member
-- '<went>:<s|r>:<id>': served or not): spans are kept SERVED_SPANS_KEEP_MS after they ended,
-- at most SERVED_SPANS_MAX (the first to end go first); calls that touch do not overlap.
-- (wavegate_core::ServedSpans is the Rust twin.)
local SERVED_SPANS_KEEP_MS = 60000
local SERVED_SPANS_MAX = 256
-- How far after now a span may end (the fleet's clocks a little apart from the server's).
local SERVED_SPANS_AHEAD_MS = 1000
-- How far a call's span, timed by its process, may reach beyond its time at the provider (ms,
-- each side): a 429's span is widened by it, a success's count narrows every span by it.
local SPAN_MARGIN_MS = 5
-- A span's start and end (Unix ms) as the record at `now` keeps them: went no earlier than the
-- record keeps and no later than SERVED_SPANS_AHEAD_MS ahead; ended no later than that and
-- after it went (a call quicker than a millisecond was there for its millisecond).
local function span_at(went, ended, now)
  local latest = now + SERVED_SPANS_AHEAD_MS
  went = math.min(math.max(went, now - SERVED_SPANS_KEEP_MS), latest)
  return went, math.max(math.min(ended, latest), went + 1)
end

-- The most of the recorded spans at once within [went, ended] — only the served ones if
-- `served_only`; the one of permit `skip` aside; each narrowed by `narrow` ms at both ends; and
-- `also`, a span {went, ended}, or nil.
local function most_at_once(went, ended, served_only, skip, also, narrow)
  local spans = redis.call('ZRANGEBYSCORE', KEYS[8], '(' .. went, '+inf', 'WITHSCORES')
  if also ~= nil then
    spans[#spans + 1] = also[1] .. ':r:'
    spans[#spans + 1] = also[2]
  end
  local edges = {}
  for i = 1, #spans, 2 do
    local start, kind, of = string.match(spans[i], '^(%d+):([sr]):(.*)$')
    start = tonumber(start)
    local stop = tonumber(spans[i + 1])
    if start ~= nil and stop ~= nil then
      start = start + narrow
      stop = math.max(stop - narrow, start)
    end
    local counted = (kind == 's' or not served_only) and of ~= skip
    if start ~= nil and stop ~= nil and start < stop and stop > went and start < ended and counted then
      edges[#edges + 1] = { math.max(start, went), 1 }
      if stop < ended then edges[#edges + 1] = { stop, -1 } end
    end
  end
  table.sort(edges, function(a, b) return a[1] < b[1] or (a[1] == b[1] and a[2] < b[2]) end)
  local at_once, most = 0, 1
  for _, edge in ipairs(edges) do
    at_once = at_once + edge[2]
    if at_once > most then most = at_once end
  end
  return most
end

-- Records, at `now`, that permit `id`'s call was at the provider from `went` to `ended`,
-- `served` or not; recording it again changes nothing.
local function record_went(id, served, went, ended, now)
  went, ended = span_at(went, ended, now)
  redis.call('ZREMRANGEBYSCORE', KEYS[8], '-inf', '(' .. (now - SERVED_SPANS_KEEP_MS))
  redis.call('ZADD', KEYS[8], ended, went .. ':' .. served .. ':' .. id)
  local over = redis.call('ZCARD', KEYS[8]) - SERVED_SPANS_MAX
  if over > 0 then redis.call('ZPOPMIN', KEYS[8], over) end
  redis.call('PEXPIRE', KEYS[8], SERVED_SPANS_KEEP_MS)
end

-- The most calls the record shows served at once while a served call was at the provider from
-- `went` to `ended`, each span narrowed by SPAN_MARGIN_MS at both ends: its own record counts it
-- (at least 1).
local function served_beside(went, ended, now)
  went, ended = span_at(went, ended, now)
  went = went + SPAN_MARGIN_MS
  ended = math.max(ended - SPAN_MARGIN_MS, went)
  return most_at_once(went, ended, true, nil, nil, SPAN_MARGIN_MS)
end

-- The most calls at the provider at once, served or not (a provider counts the calls it is
-- refusing too), while permit `id`'s refused call was there, from `went` to `ended` — itself
-- included once (its own record aside), within SPAN_MARGIN_MS of it (the fleet's clocks a little
-- apart, each call timed from its process's side of the connection); nil when the record may
-- have let calls beside it go (it holds SERVED_SPANS_MAX and the first of them ended after the
-- 429 went: a call dropped would make the 429 look within the limit).
local function met_at_once(id, went, ended, now)
  went, ended = span_at(went, ended, now)
  went, ended = math.max(0, went - SPAN_MARGIN_MS), ended + SPAN_MARGIN_MS
  if redis.call('ZCARD', KEYS[8]) >= SERVED_SPANS_MAX then
    local first = redis.call('ZRANGE', KEYS[8], 0, 0, 'WITHSCORES')
    if first[2] ~= nil and tonumber(first[2]) > went then return nil end
  end
  return most_at_once(went, ended, false, id, { went, ended }, 0)
end

-- (The report purged already, at the same now: nothing has expired since.)
if not reported then purge(now) end
local s = load_state(config, now)
poll(s, now)
local limit_before = s.limit
local effect = 'none'
local changed_from = ''
local served, served_went, served_ended = string.match(outcome, '^served:(%d+):(%d+):(%d+)$')
if served == nil then served = string.match(outcome, '^served:(%d+)$') end
local went_kind, span_went, span_ended = string.match(outcome, '^went:([sr]):(%d+):(%d+)$')
local among_went, among_ended = string.match(outcome, '^rate_limited_among:(%d+):(%d+)$')
if (served_went or span_went or among_went) ~= nil and KEYS[8] == nil then
  return fail('finish', 'a span needs the served key (KEYS[8])')
end
if served_went ~= nil then
  served = math.max(tonumber(served), served_beside(tonumber(served_went), tonumber(served_ended), now))
end
if span_went ~= nil then
  record_went(id, went_kind, tonumber(span_went), tonumber(span_ended), now)
elseif among_went ~= nil then
  -- Enforcing's 429 only with no more served at once than the limit; otherwise nothing.
  local met = met_at_once(id, tonumber(among_went), tonumber(among_ended), now)
  if met ~= nil and met <= s.limit then
    effect, limit_before = on_rate_limited(s, wave, now, retry_after, config)
  end
elseif outcome == 'success' then
  changed_from = on_success(s, wave, redis.call('ZCARD', KEYS[1]), now, config) or ''
elseif served ~= nil then
  changed_from = on_success(s, wave, math.min(redis.call('ZCARD', KEYS[1]), tonumber(served)), now, config) or ''
elseif outcome == 'rate_limited' then
  effect, limit_before = on_rate_limited(s, wave, now, retry_after, config)

elseif outcome ~= 'neutral' then
  return fail('finish', 'unknown outcome ' .. outcome)
end

local held = redis.call('ZREM', KEYS[1], id)
redis.call('HDEL', KEYS[3], id, 'm|' .. id)
if held == 1 then pc_change(id, -1) end
save_state(s, config) -- with the permits' counts (wave.lua)
local woken, ask, handed = nil, nil, nil
if held == 1 and channel ~= '' then
  local gone = redis.call('ZRANGEBYSCORE', KEYS[5], '-inf', now - WAITING_TTL)
  if #gone > 0 then forget_counted(gone) end
  for _, instance in ipairs(gone) do
    redis.call('ZREM', KEYS[4], instance)
    redis.call('ZREM', KEYS[5], instance)
    redis.call('HDEL', KEYS[6], instance, instance .. '>', 'h:' .. instance)
  end
  if #config.classes > 0 then
    woken = process_to_wake(config, s.limit, now)
  else
    local longest = redis.call('ZPOPMIN', KEYS[4])
    if #longest > 0 then
      if string.find(longest[1], '|', 1, true) then forget_counted({ longest[1] }) end
      redis.call('ZREM', KEYS[5], longest[1])
      redis.call('HDEL', KEYS[6], longest[1], longest[1] .. '>')
      -- A member of a process configured with classes ('<class>|<instance>'; every process
      -- of an upstream should have the same classes) is woken by its instance id all the same.
      woken = string.match(longest[1], '|(.*)$') or longest[1]
      if hand_off_rule ~= 'none' then ask = hand_off(longest[1], config, s, now) end
    end
  end
  -- The announcement is a courtesy: a user without channel rights (NOPERM) must not turn the
  -- release into an error (the ZREM above has happened; the waiter's poll finds the slot). A
  -- permit is handed only with a wake-up that says so and (rule 'heard') reached its process:
  -- nobody else would take it before its lease ends.
  if woken then
    local message = string.match(KEYS[1], '{([^}]*)}') or ''
    if ask then message = message .. ' ' .. s.wave .. ' ' .. s.state .. ' ' .. s.limit .. ' ' .. ask.id end
    local heard = redis.pcall('PUBLISH', channel .. woken .. '}:released', message)
    if ask and (hand_off_rule == 'all' or (type(heard) == 'number' and heard > 0)) then
      hand_over(ask, s, now)
      handed = ask.id
    end
  end
  pc_flush()
end
local cooldown_ms = 0
if s.state == 'COOLDOWN' then cooldown_ms = math.max(0, s.cooldown_until - now) end
return { held, effect, limit_before, s.limit, s.wave, s.state, cooldown_ms, changed_from,
         redis.call('ZCARD', KEYS[1]), woken or '', handed or '' }
