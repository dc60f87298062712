-- renew.lua: extend the leases of a batch of permits whose calls are still running (the lease
-- watchdog's one call per upstream).
--
-- KEYS[1] permits (zset)   KEYS[2] wave state (hash)   KEYS[3] permit waves (hash)
-- ARGV[1] lease in ms
-- ARGV[2] the generation of the state the process last saw, '' for none (see `generation` in
--         wave.lua: if it is gone, WAVEGATE_LOST and nothing is written: the process reconciles)
-- ARGV[3..] permit ids. An id that is no longer listed (its lease ended, or the store lost it:
--           a failover, an eviction, a flush) is registered again, tagged as adopt_wave says:
--           a running call counts against the limit whatever happened to its registration.
-- Reply: the ids registered again (the caller releases any whose call has ended meanwhile: a
--        renewal that reached the server after its permit's release, as a NOSCRIPT reload
--        can make it, must not bring the permit back for a whole lease).
if #ARGV < 2 then return fail('renew', 'expected at least 2 ARGV, got ' .. #ARGV) end
local lease = to_int(ARGV[1], 'lease')
if not generation(ARGV[2], false) then return state_lost('renew') end
local now = now_ms()
purge(now)
local again = {}
local wave = nil
for i = 3, #ARGV do
  if redis.call('ZSCORE', KEYS[1], ARGV[i]) then
    redis.call('ZADD', KEYS[1], 'XX', 'GT', now + lease, ARGV[i])
  else
    if not wave then wave = adopt_wave() end
    if redis.call('ZADD', KEYS[1], now + lease, ARGV[i]) == 1 then pc_change(ARGV[i], 1) end
    redis.call('HSET', KEYS[3], ARGV[i], wave)
    again[#again + 1] = ARGV[i]
  end
end
pc_flush() -- the counts by class and tenant, if kept (wave.lua)
return again
