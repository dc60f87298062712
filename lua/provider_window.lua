-- provider_window.lua: the provider's announced windows, "R left until T", kept for the fleet.
--
-- Not a script on its own: concatenated after wave.lua into every upstream script (see
-- crates/wavegate-redis/src/scripts.rs). The Lua twin of wavegate-core's ProviderWindows
-- (crates/wavegate-core/src/provider_window.rs); both pass the "provider window" cases of
-- wavegate_core::spec.
--
-- Fields of the wave state hash (KEYS[2]): pw_requests_left, pw_requests_until, pw_requests_at,
-- pw_requests_to, pw_requests_rough, pw_requests_base, pw_requests_each, pw_requests_debt and the
-- same for tokens, input and output
-- (Anthropic's parts, tracked apart) (ms of Redis TIME; an end of 0 or in the past: no window;
-- `to` 0: a fixed window, else the limit a continuously refilled bucket grows back to; rough '1':
-- what is left came from a report without a mark; base: the place in the count of grants after
-- which every grant was taken off in full (the mark of the report what is left came from; for a
-- report without a mark, the count when it came; moved up to the mark of a report not taken in;
-- '': no report set it; missing or unreadable: nothing is known to be taken off); each: for a level from
-- a report without a mark, what it took off for each call in flight ('' for one with a mark);
-- debt: what was taken off beyond what was left (a count or a grant floored at 0), paid first by
-- what comes back.
--
-- Fields pw_sent_requests, pw_sent_tokens, pw_sent_output and pw_sent_back: the grants counted
-- since the first report (absent before it), one request, the tokens reserved and their output
-- part per grant, and the output settlements gave back; a grant's count right after it is its
-- mark, KEYS[3] field 'm|<permit id>' = '<requests>:<tokens>:<granted ms>:<output>:<back>'
-- (kept while the permit is; an older mark without the last two is no mark).
--
-- Rules:
--   * a report of R left with a reset in D (at most PW_MAX_RESET ms: a day) by a call whose
--     permit has a mark: the provider counted R at that call's admission, so what it has not
--     counted is what was granted since the mark: R - cost(since) is left, until now + D; a
--     call without a mark (granted before the first report): with N other calls in flight
--     (each assumed to cost one request and as many tokens as the reporting call reserved),
--     R - cost(N); a report of the same window (ending within
--     PW_SAME_WINDOW ms of the known end) only lowers what is left (also when it is a report
--     of a refilled bucket: a running fixed window that ends when the bucket would be full
--     again is that window), a later window replaces it,
--     and so does an earlier one (an older answer's end only ever lies later: an earlier end
--     is the provider's newer word);
--   * a report of a continuously refilled bucket (OpenAI: `to` its limit L, D the time until it
--     is full): E = R - cost(since) as of the reporting call's grant (with a mark; else
--     R - cost(N) as of now), full again when the same rate has refilled it
--     (then + ceil(D * (L - E) / (L - R)), at most a day; nothing kept when that is past); in
--     between what is left grows
--     linearly from E to L (pw_level, rounded down); a grant re-bases it at its time keeping the
--     rate; a full bucket says nothing; a running bucket with no more left now than E keeps its
--     word (answers arrive out of order, and calls granted before the reporting one may reach
--     the provider after it), unless its word is rough (from a report without a mark) and the
--     report has a mark; a fixed window is replaced;
--   * output given back by a settlement goes back to the output window at once (pw_give_back:
--     level + back, at most `to`, re-based at now keeping the rate); the doubles are computed in the order of
--     TrackedWindow's (crates/wavegate-core/src/provider_window.rs); a call the provider refused
--     (a 429: it counted none of it) gives back to each window what it took off of it (pw_refund,
--     of one request, its tokens, its input and output parts): all of it when its place is above
--     the base (or the base is ''), at most `each` of one at or below it (nothing with a mark: a
--     report of a call granted after it neither counted nor took it off); the debt is paid
--     first (pw_credit); once per permit (while it is held), before its answer's report is
--     taken in (report_window.lua), or at its settlement when it had none (pw_refuse);
--   * what is left is at most PW_MOST_LEFT; an end read back lies at most PW_MAX_RESET ms after now (a backward jump of TIME, a
--     value written by hand): no window outlives its clamp;
--   * the input and output windows (Anthropic's) are tracked apart, each part against its own:
--     a report of both ends the tokens window; a grant costs its estimate less its output part
--     from the input window and its output part from the output window; with a mark, the
--     output window's report adds what settlements gave back since it (R - cost + back, at most
--     `to`); without a mark each other call costs its whole reservation in each part;
--   * a grant costs one request and its token estimate while a window runs;
--   * while a window runs with less left than a grant needs, grants wait until its end (a
--     refilled bucket: until it has grown back to what the grant needs); a spent
--     tokens window refuses even a grant that reserves no tokens.

local PW_SAME_WINDOW = 1000
local PW_MAX_RESET = 86400000
local PW_MOST_LEFT = 1000000000000000
local PW_NAMES = { 'requests', 'tokens', 'input', 'output' }

-- A stored number as what it may mean: an integer in [0, most], 0 when unreadable.
local function pw_clamp(value, most)
  local n = tonumber(value)
  if n == nil or n ~= n or n < 0 then return 0 end
  return math.floor(math.min(n, most))
end

-- A window nothing is known of.
local function pw_none()
  return { left = 0, ['until'] = 0, at = 0, to = 0, rough = false, base = nil, each = nil, debt = 0 }
end

local function pw_f(n) return string.format('%.0f', n) end

-- Appends window `name`'s fields and values to `fields`.
local function pw_fields(fields, name, t)
  for _, v in ipairs({ 'pw_' .. name .. '_left', pw_f(t.left), 'pw_' .. name .. '_until', pw_f(t['until']),
    'pw_' .. name .. '_at', pw_f(t.at), 'pw_' .. name .. '_to', pw_f(t.to), 'pw_' .. name .. '_rough',
    t.rough and '1' or '0', 'pw_' .. name .. '_base', t.base and pw_f(t.base) or '', 'pw_' .. name .. '_each',
    t.each and pw_f(t.each) or '', 'pw_' .. name .. '_debt', pw_f(t.debt) }) do
    table.insert(fields, v)
  end
end

local function pw_save(w)
  local fields = {}
  for _, name in ipairs(PW_NAMES) do pw_fields(fields, name, w[name]) end
  if w.sent then
    for _, v in ipairs({ 'pw_sent_requests', pw_f(w.sent.requests), 'pw_sent_tokens', pw_f(w.sent.tokens),
      'pw_sent_output', pw_f(w.sent.output), 'pw_sent_back', pw_f(w.sent.back) }) do
      table.insert(fields, v)
    end
  end
  state_write(unpack(fields))
end

-- The windows as stored, clamped to what they may mean at `now`; a clamped end is saved, so it
-- stays put rather than moving with now.
local function pw_load(now)
  local names = {}
  for _, name in ipairs(PW_NAMES) do
    for _, field in ipairs({ 'left', 'until', 'at', 'to', 'rough', 'base', 'each', 'debt' }) do
      table.insert(names, 'pw_' .. name .. '_' .. field)
    end
  end
  for _, field in ipairs({ 'pw_sent_requests', 'pw_sent_tokens', 'pw_sent_output', 'pw_sent_back' }) do
    table.insert(names, field)
  end
  local v = state_read(names)
  local last = now + PW_MAX_RESET
  local w = {}
  local moved = false
  for i, name in ipairs(PW_NAMES) do
    local at = (i - 1) * 8
    -- '' is none (no report set it: every call in full); a base missing (a window stored by an
    -- older version) or unreadable takes off nothing known: no refusal is given back (errs low).
    local base = nil
    if v[at + 6] ~= '' then
      base = PW_MOST_LEFT
      if tonumber(v[at + 6]) then base = pw_clamp(v[at + 6], PW_MOST_LEFT) end
    end
    local each = nil
    if v[at + 7] and v[at + 7] ~= '' and tonumber(v[at + 7]) then each = pw_clamp(v[at + 7], PW_MOST_LEFT) end
    w[name] = { left = pw_clamp(v[at + 1], PW_MOST_LEFT), ['until'] = pw_clamp(v[at + 2], last),
      at = pw_clamp(v[at + 3], last), to = pw_clamp(v[at + 4], PW_MOST_LEFT), rough = v[at + 5] == '1', base = base,
      each = each, debt = pw_clamp(v[at + 8], PW_MOST_LEFT) }
    if (tonumber(v[at + 2]) or 0) > last then moved = true end
  end
  local sent = #PW_NAMES * 8
  if v[sent + 1] then
    w.sent = { requests = pw_clamp(v[sent + 1], PW_MOST_LEFT), tokens = pw_clamp(v[sent + 2], PW_MOST_LEFT),
      output = pw_clamp(v[sent + 3], PW_MOST_LEFT), back = pw_clamp(v[sent + 4], PW_MOST_LEFT) }
  end
  if moved then pw_save(w) end
  return w
end

-- Whether a window says anything at `now`: before its end, and a refilled bucket while not full.
local function pw_runs(t, now)
  return now < t['until'] and (t.to == 0 or t.left < t.to)
end

-- The time a refilled bucket takes to grow from `left` to `to` (at least 1 ms).
local function pw_span(t)
  return t['until'] - math.min(t.at, t['until'] - 1)
end

-- What is left at `now` (a refilled bucket: grown back since `at`, rounded down, at most `to`).
local function pw_level(t, now)
  if t.to == 0 or not pw_runs(t, now) then return t.left end
  local since = math.max(0, now - t.at)
  local grown = math.floor(t.left + (t.to - t.left) * since / pw_span(t))
  return math.min(grown, t.to)
end

-- How long a grant reserving `tokens`, `output` of them its answer's, must wait, or nil when no
-- window refuses it.
local function pw_wait(w, now, tokens, output)
  output = math.min(output, tokens)
  local need = { requests = 1, tokens = math.max(tokens, 1), input = math.max(tokens - output, 1),
    output = math.max(output, 1) }
  local wait = nil
  for _, name in ipairs(PW_NAMES) do
    local t = w[name]
    if pw_runs(t, now) and pw_level(t, now) < need[name] then
      local to_end = t['until'] - now
      local this = to_end
      if t.to > 0 and need[name] <= t.to then
        local at = math.ceil(t.at + (need[name] - t.left) * pw_span(t) / (t.to - t.left))
        this = math.min(math.max(at - now, 1), to_end)
      end
      wait = math.max(wait or 0, this)
    end
  end
  return wait
end

-- A refilled bucket with `left` at `now`, at the same rate: full again once what is missing has
-- grown back (TrackedWindow::rebase).
local function pw_rebase(t, now, left)
  local full_in = math.ceil((t.to - left) * pw_span(t) / (t.to - t.left))
  t.left = left
  t['until'] = now + math.min(math.max(full_in, 1), PW_MAX_RESET)
  t.at = now
end

-- Counts a grant reserving `tokens`, `output` of them its answer's, down from the running
-- windows, and in the grants counted since the first report (saved by the caller). Returns
-- whether anything changed.
local function pw_charge(w, now, tokens, output)
  output = math.min(output, tokens)
  local cost = { requests = 1, tokens = tokens, input = tokens - output, output = output }
  local changed = false
  if w.sent then
    w.sent.requests = math.min(w.sent.requests + 1, PW_MOST_LEFT)
    w.sent.tokens = math.min(w.sent.tokens + tokens, PW_MOST_LEFT)
    w.sent.output = math.min(w.sent.output + output, PW_MOST_LEFT)
    changed = true
  end
  for _, name in ipairs(PW_NAMES) do
    local t = w[name]
    if pw_runs(t, now) then
      -- What the window did not hold is its debt (TrackedWindow::debt).
      t.debt = math.min(t.debt + math.max(0, cost[name] - pw_level(t, now)), PW_MOST_LEFT)
      if t.to == 0 then
        t.left = math.max(0, t.left - cost[name])
      else
        pw_rebase(t, now, math.max(0, pw_level(t, now) - cost[name]))
      end
      changed = true
    end
  end
  return changed
end

-- Window `name` of `w` takes back `back` at `now` (at most `to` for a refilled bucket); its
-- fields are appended to `fields` when it runs (TrackedWindow::credit).
local function pw_credit(w, name, now, back, fields)
  local t = w[name]
  if not pw_runs(t, now) then return end
  -- What was taken off beyond what was left comes back first.
  local paid = math.min(back, t.debt)
  t.debt = t.debt - paid
  back = back - paid
  if back > 0 and t.to == 0 then
    t.left = math.min(t.left + back, PW_MOST_LEFT)
  elseif back > 0 then
    pw_rebase(t, now, math.min(pw_level(t, now) + back, t.to))
  end
  pw_fields(fields, name, t)
end

-- A settlement gave back `back` tokens of an answer's output: the output window takes them back
-- now, and they are counted (from the first report on), so a later report with a mark adds back
-- what was given back after its call's grant. Saved here.
local function pw_give_back(back, now)
  local w = pw_load(now)
  -- Only what changes is written: this runs on every release that gives output back.
  local fields = {}
  pw_credit(w, 'output', now, back, fields)
  if w.sent then
    w.sent.back = math.min(w.sent.back + back, PW_MOST_LEFT)
    for _, v in ipairs({ 'pw_sent_back', pw_f(w.sent.back) }) do table.insert(fields, v) end
  end
  if #fields > 0 then state_write(unpack(fields)) end
end

-- A call the provider refused (a 429: it counted none of it), `tokens` reserved and `output` of
-- them its answer's, gives back to every running window of `w` at `now` what it took off of it
-- (ProviderWindows::refuse); the fields of the windows it changed are appended to `fields`.
-- Not counted for the marks: an answer to a call granted before the refused one, coming after
-- the refusal, still takes it off (it erred low; adding every refusal since a mark back would
-- err high for a call granted before the mark and refused after it).
-- `place`: the refused call's place in the count of grants (its mark's first field), nil
-- without a mark; each window takes back what it took off of it (TrackedWindow::took_off): all
-- of a call granted after its base, at most `each` of one before it, else nothing.
local function pw_refund(w, now, tokens, output, place, fields)
  output = math.min(output, tokens)
  local back = { requests = 1, tokens = tokens, input = tokens - output, output = output }
  for _, name in ipairs(PW_NAMES) do
    local t = w[name]
    local took = 0
    if t.base == nil or (place ~= nil and place > t.base) then
      took = back[name]
    elseif t.each ~= nil then
      took = math.min(back[name], t.each)
    end
    pw_credit(w, name, now, took, fields)
  end
end

-- The place in the count of grants of a permit's mark (as pw_mark writes it), nil for none.
local function pw_place(mark)
  if not mark then return nil end
  return tonumber(string.match(mark, '^(%d+):'))
end

-- pw_refund of a refused call's settlement (its answer had no report), `mark` its permit's.
-- Saved here.
local function pw_refuse(tokens, output, mark, now)
  local w = pw_load(now)
  local fields = {}
  pw_refund(w, now, tokens, output, pw_place(mark), fields)
  if #fields > 0 then state_write(unpack(fields)) end
end

-- The mark of a grant: the count of grants right after it and its time
-- ('<requests>:<tokens>:<ms>:<output>:<back>'), or nil when none is kept.
local function pw_mark(w, now)
  if not w.sent then return nil end
  return string.format('%.0f:%.0f:%.0f:%.0f:%.0f', w.sent.requests, w.sent.tokens, now, w.sent.output, w.sent.back)
end

-- Registers permit `id`, granted in `wave`, until now + lease, charged to the provider's windows
-- `w` with its mark (the grant of acquire.lua, the hand-off of finish.lua).
local function pw_grant(w, now, id, wave, lease, tokens, output)
  if redis.call('ZADD', KEYS[1], now + lease, id) == 1 then pc_change(id, 1) end
  if pw_charge(w, now, tokens, output) then pw_save(w) end
  local mark = pw_mark(w, now)
  if mark then
    redis.call('HSET', KEYS[3], id, wave, 'm|' .. id, mark)
  else
    redis.call('HSET', KEYS[3], id, wave)
  end
end

-- What was granted (and given back) after `mark` (a permit's, as pw_mark wrote it), as
-- {requests, tokens, output, back, at, place} (at: the permit's grant, at most `now`; place: its
-- place in the count of grants); nil without a
-- count, for a mark unreadable or ahead of the count (the count started over).
local function pw_sent_since(w, mark, now)
  if not w.sent or not mark then return nil end
  local r, t, at, o, b = string.match(mark, '^(%d+):(%d+):(%d+):(%d+):(%d+)$')
  r, t, at, o, b = tonumber(r), tonumber(t), tonumber(at), tonumber(o), tonumber(b)
  if not r or not t or not at or not o or not b then return nil end
  local s = w.sent
  if r > s.requests or t > s.tokens or o > s.output or b > s.back then return nil end
  return { requests = s.requests - r, tokens = s.tokens - t, output = s.output - o, back = s.back - b,
    at = math.min(at, now), place = r }
end

-- A report with a mark at `base` (`each` nil) not taken in (the window knows less): the calls
-- granted before it are not given back any more (TrackedWindow::saw).
local function pw_saw(t, base, each)
  if base ~= nil and each == nil then t.base = math.max(t.base or base, base) end
end

-- What a report of `remaining` leaves, at most `most`, once `others_cost` (the grants it could not
-- count) is taken off and `back` (with a mark: given back since) added: the level, and what those
-- grants took off beyond it, the debt (WindowCost::leaves).
local function pw_leaves(remaining, back, most, others_cost)
  local counted = math.min(remaining + (back or 0), most)
  return math.max(0, counted - others_cost), math.max(0, others_cost - counted)
end

-- Takes in one window's report: `remaining` left, resetting in `reset_ms`, `others_cost` spent
-- by the calls still in flight; `to` > 0: a bucket refilled continuously to `to`, full in
-- `reset_ms`; `back`: nil for a report without a mark, else what settlements gave back since the
-- reporting call's grant (0 but for the output window); `base`: the place in the count of grants
-- after which every grant is taken off in full (the reporting call's mark; without one, the count
-- now); `each`: without a mark, what each call in flight was taken off at (nil with one).
local function pw_report_one(t, now, remaining, reset_ms, others_cost, to, as_of, back, base, each)
  local ends = now + math.min(reset_ms, PW_MAX_RESET)
  -- a running fixed window ending when this bucket would be full again is that window
  local known_fixed = t.to == 0 and pw_runs(t, now) and math.abs(ends - t['until']) <= PW_SAME_WINDOW
  if to > 0 and not known_fixed then
    to = math.min(to, PW_MOST_LEFT)
    remaining = math.min(remaining, to)
    local estimate, debt = pw_leaves(remaining, back, to, others_cost)
    if reset_ms == 0 or estimate >= to then return end
    local reset = math.min(reset_ms, PW_MAX_RESET)
    local full_in = reset
    if remaining < to then full_in = math.ceil(reset * (to - estimate) / (to - remaining)) end
    local full = as_of + math.min(math.max(full_in, 1), PW_MAX_RESET)
    if full <= now then return end -- full again by now
    local marked = back ~= nil
    local reported = { left = estimate, ['until'] = full, at = as_of, to = to }
    local keeps_word = not (t.rough and marked) and t.to > 0 and pw_runs(t, now)
    if keeps_word and pw_level(t, now) - t.debt <= pw_level(reported, now) - debt then
      pw_saw(t, base, each)
      return
    end
    t.left = estimate
    t['until'] = full
    t.at = as_of
    t.to = to
    t.rough = not marked
    t.base = base
    t.each = each
    t.debt = debt
    return
  end
  if reset_ms == 0 then return end
  local estimate, debt = pw_leaves(remaining, back, PW_MOST_LEFT, others_cost)
  if known_fixed then
    if estimate - debt < t.left - t.debt then
      t.left = estimate
      t.base = base
      t.each = each
      t.debt = debt
    else
      pw_saw(t, base, each)
    end
    t['until'] = math.max(t['until'], ends)
  else
    t.left = estimate
    t['until'] = ends
    t.at = now
    t.to = 0
    t.rough = back == nil
    t.base = base
    t.each = each
    t.debt = debt
  end
end
