-- heartbeat.lua: keep this process on the list of live instances; count the live ones.
--
-- KEYS[1] sorted set of instances: member = instance id, score = when it stops counting (ms)
-- ARGV[1] instance id
-- ARGV[2] how long the heartbeat counts, in ms
-- Reply: the number of live instances, this one included.
-- (Not prefixed with wave.lua's KEYS layout: this key is per namespace, not per upstream.)
if #ARGV ~= 2 then return redis.error_reply('ERR wavegate heartbeat: expected 2 ARGV, got ' .. #ARGV) end
local ttl = tonumber(ARGV[2])
if ttl == nil or ttl <= 0 then return redis.error_reply('ERR wavegate heartbeat: ttl must be positive') end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
redis.call('ZADD', KEYS[1], now + ttl, ARGV[1])
redis.call('PEXPIRE', KEYS[1], ttl * 2)
return redis.call('ZCARD', KEYS[1])
