-- window_report.lua: a response said what is left of the provider's windows; keep it for the fleet.
-- take_window_report(at) takes the report in from ARGV[at + 1 .. at + 24]: report_window.lua
-- alone (at = 0), and finish.lua before the release it rides on (one round trip per answer).
--
-- KEYS[1] permits (zset)   KEYS[2] wave state (hash)   KEYS[3] permit waves (hash)
-- ARGV[at + 1] requests left, or '' when the response did not say   ARGV[at + 2] its reset, ms from now
-- ARGV[at + 3] tokens left, or ''                                    ARGV[at + 4] its reset, ms from now
-- ARGV[at + 5] tokens the reporting call reserved (the others in flight are assumed to as well)
-- ARGV[at + 6] the reporting call's permit id ('' for none): the grants made since its mark are the
--         calls the provider may not have counted yet; without a mark, the other permits held
--         (this one is not counted, held or already released). A report starts the count of
--         grants (provider_window.lua).
-- ARGV[at + 7] the requests limit announced, or '' when none with a known window   ARGV[at + 8] its window, ms
-- ARGV[at + 9] the tokens limit announced, or ''                                   ARGV[at + 10] its window, ms
-- ARGV[at + 11] '1': forget the windows kept before taking the report in (an operator's clear), '0'
-- ARGV[at + 12] the limit the requests window refills to when it is a continuously refilled bucket
--          (OpenAI: its reset is the time to a full bucket), '0' for a fixed window
-- ARGV[at + 13] likewise for the tokens window
-- ARGV[at + 14] the input tokens limit announced (Anthropic's ITPM), or ''   ARGV[at + 15] its window, ms
-- ARGV[at + 16] the output tokens limit announced (OTPM), or ''              ARGV[at + 17] its window, ms
-- ARGV[at + 18] input tokens left (Anthropic's input window, tracked apart), or ''
-- ARGV[at + 19] its reset, ms from now   ARGV[at + 20] the limit it refills to, '0' for a fixed window
-- ARGV[at + 21 .. at + 23] likewise for the output window
-- ARGV[at + 24] '' when the answer served its call; '<tokens>:<output>' when it refused it (a 429)
--          having reserved that many tokens, that many of them output: the provider counted none
--          of it, so every window takes it back before the report is taken in (pw_refund)
-- See provider_window.lua and learned_limit.lua for the rules.
-- `now` is the caller's time (ms) when it has read it already, else nil.
-- Returns {requests_left, requests_wait_ms, tokens_left, tokens_wait_ms, input_left,
--        input_wait_ms, output_left, output_wait_ms} (what is left now; a wait of 0: the window
--        does not run; for a refilled bucket the time until it is full)
local REPORT_ARGS = 24
local function take_window_report(at, now)
  now = now or now_ms()
  purge(now)
  local tokens_each = to_int(ARGV[at + 5], 'tokens each')
  local w = pw_load(now)
  if ARGV[at + 11] == '1' then
    -- The count of grants goes on: the marks of the permits held refer to it.
    w = { requests = pw_none(), tokens = pw_none(), input = pw_none(), output = pw_none(), sent = w.sent }
  end
  local mark = nil
  if ARGV[at + 6] ~= '' then mark = redis.call('HGET', KEYS[3], 'm|' .. ARGV[at + 6]) end
  if ARGV[at + 24] ~= '' then
    local tokens, output = string.match(ARGV[at + 24], '^(%d+):(%d+)$')
    if not tokens then
      error({ err = 'ERR wavegate: a refused call must be <tokens>:<output>, got ' .. ARGV[at + 24] })
    end
    pw_refund(w, now, tonumber(tokens), tonumber(output), pw_place(mark), {}) -- saved with the report
  end
  local since = pw_sent_since(w, mark, now)
  -- With a mark, every grant after it is taken off in full (base); without one, each call in
  -- flight at the reporting call's reservation (each_request, each_token), and every grant after
  -- the count as it stands now.
  local requests_cost, tokens_cost, input_cost, output_cost, back, marked, as_of
  local base, each_request, each_token
  if since then
    marked = 0
    requests_cost, tokens_cost, as_of = since.requests, since.tokens, since.at
    input_cost, output_cost, back = math.max(0, since.tokens - since.output), since.output, since.back
    base = since.place
  else
    base = (w.sent and w.sent.requests) or 0
    each_request, each_token = 1, tokens_each
    -- No mark: the other permits held (ZCARD and ZSCORE only then), each costing its whole
    -- reservation in each part.
    local others = redis.call('ZCARD', KEYS[1])
    if ARGV[at + 6] ~= '' and redis.call('ZSCORE', KEYS[1], ARGV[at + 6]) then others = others - 1 end
    requests_cost, tokens_cost, as_of = others, others * tokens_each, now
    input_cost, output_cost = tokens_cost, tokens_cost
  end
  if ARGV[at + 1] ~= '' then
    pw_report_one(w.requests, now, to_int(ARGV[at + 1], 'requests left'), to_int(ARGV[at + 2], 'requests reset'), requests_cost,
      to_int(ARGV[at + 12], 'requests refill'), as_of, marked, base, each_request)
  end
  if ARGV[at + 3] ~= '' then
    pw_report_one(w.tokens, now, to_int(ARGV[at + 3], 'tokens left'), to_int(ARGV[at + 4], 'tokens reset'), tokens_cost,
      to_int(ARGV[at + 13], 'tokens refill'), as_of, marked, base, each_token)
  end
  if ARGV[at + 18] ~= '' and ARGV[at + 21] ~= '' then
    -- The parts are tracked apart: the tokens window ends.
    w.tokens = pw_none()
    pw_report_one(w.input, now, to_int(ARGV[at + 18], 'input left'), to_int(ARGV[at + 19], 'input reset'), input_cost,
      to_int(ARGV[at + 20], 'input refill'), as_of, marked, base, each_token)
    pw_report_one(w.output, now, to_int(ARGV[at + 21], 'output left'), to_int(ARGV[at + 22], 'output reset'), output_cost,
      to_int(ARGV[at + 23], 'output refill'), as_of, back, base, each_token)
  end
  if ARGV[at + 11] ~= '1' and not w.sent then w.sent = { requests = 0, tokens = 0, output = 0, back = 0 } end
  pw_save(w)
  if ARGV[at + 7] ~= '' then ll_report(now, 'requests', to_int(ARGV[at + 7], 'requests limit'), to_int(ARGV[at + 8], 'requests window')) end
  if ARGV[at + 9] ~= '' then ll_report(now, 'tokens', to_int(ARGV[at + 9], 'tokens limit'), to_int(ARGV[at + 10], 'tokens window')) end
  if ARGV[at + 14] ~= '' then ll_report(now, 'input', to_int(ARGV[at + 14], 'input limit'), to_int(ARGV[at + 15], 'input window')) end
  if ARGV[at + 16] ~= '' then ll_report(now, 'output', to_int(ARGV[at + 16], 'output limit'), to_int(ARGV[at + 17], 'output window')) end
  local function reply(t)
    if not pw_runs(t, now) then return t.left, 0 end
    return pw_level(t, now), t['until'] - now
  end
  local requests_left, requests_wait = reply(w.requests)
  local tokens_left, tokens_wait = reply(w.tokens)
  local input_left, input_wait = reply(w.input)
  local output_left, output_wait = reply(w.output)
  return { requests_left, requests_wait, tokens_left, tokens_wait, input_left, input_wait, output_left, output_wait }
end
