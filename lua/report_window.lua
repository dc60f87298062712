-- report_window.lua: a response said what is left of the provider's windows; keep it for the fleet.
--
-- KEYS[1] permits (zset)   KEYS[2] wave state (hash)   KEYS[3] permit waves (hash)
-- ARGV[1..24] the report (take_window_report in window_report.lua says each)
-- Reply: {requests_left, requests_wait_ms, tokens_left, tokens_wait_ms, input_left,
--        input_wait_ms, output_left, output_wait_ms} (what is left now; a wait of 0: the window
--        does not run; for a refilled bucket the time until it is full)
-- A release takes its call's report in itself (finish.lua), in the same round trip.
if #ARGV ~= REPORT_ARGS then return fail('report_window', 'expected ' .. REPORT_ARGS .. ' ARGV, got ' .. #ARGV) end
return take_window_report(0)
