-- heartbeat.lua: keep this process on the list of live instances; count the live ones; keep
-- the fleet's one gauge reader.
--
-- KEYS[1] sorted set of instances: member = instance id, score = when it stops counting (ms);
--         plus at most one member 'reader:<instance>' (instance ids hold no ':'), score
--         READER_BASE + when its turn ends: the process that reads the shared gauges (budgets
--         left, learned limits) for the whole fleet, so the fleet sends one status script per
--         upstream per second, not one per process
-- ARGV[1] instance id
-- ARGV[2] how long the heartbeat counts, in ms
-- ARGV[3] how long a turn as the gauge reader lasts unless renewed, in ms (0: this process
--         does not take part)
-- Reply: {live, reader}: the number of live instances, this one included; 1 if this process
--        is the gauge reader until its next heartbeat, else 0.
-- (Not prefixed with wave.lua's KEYS layout: this key is per namespace, not per upstream.)
if #ARGV ~= 3 then return redis.error_reply('ERR wavegate heartbeat: expected 3 ARGV, got ' .. #ARGV) end
local ttl = tonumber(ARGV[2])
if ttl == nil or ttl <= 0 then return redis.error_reply('ERR wavegate heartbeat: ttl must be positive') end
local turn = tonumber(ARGV[3])
if turn == nil or turn < 0 then return redis.error_reply('ERR wavegate heartbeat: the reader turn must be >= 0') end
-- Far above any time in ms (2^50 ms is 35,000 years) and exact in a double with one added.
local READER_BASE = 1125899906842624
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
redis.call('ZADD', KEYS[1], now + ttl, ARGV[1])
local reader = 0
if turn > 0 then
  local mine = 'reader:' .. ARGV[1]
  local current = redis.call('ZRANGEBYSCORE', KEYS[1], READER_BASE, '+inf', 'WITHSCORES')
  local held = false
  for k = 1, #current, 2 do
    local ends = tonumber(current[k + 1]) - READER_BASE
    if current[k] ~= mine and ends > now then
      held = true
    elseif current[k] ~= mine then
      redis.call('ZREM', KEYS[1], current[k]) -- a turn that ended (its process stopped)
    end
  end
  if not held then
    redis.call('ZADD', KEYS[1], READER_BASE + now + turn, mine)
    reader = 1
  end
end
redis.call('PEXPIRE', KEYS[1], ttl * 2)
return { redis.call('ZCOUNT', KEYS[1], '-inf', '(' .. READER_BASE), reader }
