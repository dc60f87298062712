-- renew.lua: extend the leases of a batch of held permits (the lease watchdog's one call).
--
-- KEYS[1] permits (zset)   KEYS[2] wave state (hash, unused)   KEYS[3] permit waves (hash)
-- ARGV[1] lease in ms
-- ARGV[2..] permit ids; ids no longer held are not added back
-- Reply: the number of ids that were still held and got the new lease.
if #ARGV < 1 then return fail('renew', 'expected at least 1 ARGV, got 0') end
local lease = to_int(ARGV[1], 'lease')
local now = now_ms()
purge(now)
local renewed = 0
for i = 2, #ARGV do
  if redis.call('ZSCORE', KEYS[1], ARGV[i]) then
    redis.call('ZADD', KEYS[1], 'XX', 'GT', now + lease, ARGV[i])
    renewed = renewed + 1
  end
end
return renewed
