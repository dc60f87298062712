-- live.lua: an upstream's live settings, changed by an operator while the fleet runs, under a
-- version (wavegate_core::LiveBoard is the in-process twin).
--
-- KEYS[1] hash of the live settings: 'epoch', 'version', and per setting <name> = its value
--         and, for an override, <name>@until = when it ends (ms, Redis time). The epoch is
--         written with the first version (Redis TIME in µs, when there is none): a hash the
--         store lost (FLUSHALL, an eviction, an empty restart) starts over at version 0 with
--         no epoch, then a new one, so a process tells a new start from the versions it saw.
-- ARGV[1] 'read', 'set' or 'clear'
-- read   ARGV[2] the epoch the process applied ('' for none), ARGV[3] the version it applied
--                ('' for none). An override whose end has passed is dropped first, and the
--                version bumped once for the drop: the first process to look after the end
--                reverts it for the fleet, and a process started later reads the same.
--        Reply: {epoch ('' for none), version} when both are the ones sent, else {epoch,
--               version, name, value, remaining ms (-1: no end), ...} for each setting held.
--               An epoch or version that is not a count below 2^53 is an error.
-- set    ARGV[2] setting (`limit`, `requests_per_minute`, ..., or a class's: `weight|<class>`,
--        `reserve|<class>`), ARGV[3] value (a non-negative integer), ARGV[4] time to live in ms
--        (0: none), ARGV[5] the fleet's channel of live changes ('<prefix>:{live:changes}:released'),
--        told the upstream's name (the hash tag of KEYS[1]) so every process looks at once
--        (with pcall: a user without channel rights still sets; they look within 1 s)
-- clear  ARGV[2] setting, ARGV[3] '', ARGV[4] '', ARGV[5] the changes channel, as for set
--        Reply (set and clear): the new version.
-- (Not prefixed with wave.lua: it touches no permit and no wave state; the scripts see a live
-- limit as the base limit the processes send them, which each process takes from here.)
local op = ARGV[1]
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function bad(message)
  return redis.error_reply('ERR wavegate live: ' .. message)
end
-- The largest count a Lua number holds exactly (LiveStamp::MAX).
local MAX_COUNT = 9007199254740991
-- The epoch and version the hash holds ('' and 0 for none), or nil and what is wrong.
local function stamp(epoch, version)
  epoch = epoch or ''
  if epoch ~= '' and (not string.match(epoch, '^[1-9]%d*$') or #epoch > 16 or tonumber(epoch) > MAX_COUNT) then
    return nil, 'the stored epoch is not a count: ' .. string.sub(epoch, 1, 40)
  end
  version = version or '0'
  if not string.match(version, '^%d+$') or #version > 16 or tonumber(version) > MAX_COUNT then
    return nil, 'the stored version is not a count: ' .. string.sub(version, 1, 40)
  end
  return epoch, tonumber(version)
end
-- A new version, with an epoch written first if there is none: the epoch and the version.
local function bump(epoch)
  if epoch == '' then
    local t = redis.call('TIME')
    epoch = t[1] .. string.format('%06d', tonumber(t[2]))
    redis.call('HSET', KEYS[1], 'epoch', epoch)
  end
  return epoch, redis.call('HINCRBY', KEYS[1], 'version', 1)
end

if op == 'read' then
  if #ARGV ~= 3 then return bad('expected 3 ARGV, got ' .. #ARGV) end
  local now = now_ms()
  local flat = redis.call('HGETALL', KEYS[1])
  local held, dropped = {}, false
  for i = 1, #flat, 2 do held[flat[i]] = flat[i + 1] end
  local epoch, version = stamp(held['epoch'], held['version'])
  if not epoch then return bad(version) end
  for name, value in pairs(held) do
    local setting = string.match(name, '^(.+)@until$')
    if setting and tonumber(value) and tonumber(value) <= now then
      redis.call('HDEL', KEYS[1], setting, name)
      held[setting], held[name], dropped = nil, nil, true
    end
  end
  if dropped then epoch, version = bump(epoch) end
  if epoch == ARGV[2] and version == tonumber(ARGV[3]) then return { epoch, version } end
  local reply = { epoch, version }
  for name, value in pairs(held) do
    if name ~= 'version' and name ~= 'epoch' and not string.find(name, '@', 1, true) then
      local ends = tonumber(held[name .. '@until'])
      reply[#reply + 1] = name
      reply[#reply + 1] = value
      reply[#reply + 1] = ends and math.max(ends - now, 0) or -1
    end
  end
  return reply
end

if op ~= 'set' and op ~= 'clear' then return bad('the operation must be read, set or clear, got ' .. tostring(op)) end
if #ARGV ~= 5 then return bad('expected 5 ARGV, got ' .. #ARGV) end
local name = ARGV[2]
local plain = string.match(name, '^[a-z][a-z_]*$') and name ~= 'version' and name ~= 'epoch'
local of_class = string.match(name, '^[a-z]+|[%w_.%-]+$')
if not plain and not of_class then return bad('bad setting ' .. name) end
local epoch, version = stamp(unpack(redis.call('HMGET', KEYS[1], 'epoch', 'version')))
if not epoch then return bad(version) end
if op == 'set' then
  local value, ttl = tonumber(ARGV[3]), tonumber(ARGV[4])
  if value == nil or value ~= math.floor(value) or value < 0 then return bad('the value must be a non-negative integer') end
  if ttl == nil or ttl ~= math.floor(ttl) or ttl < 0 then return bad('the time to live must be a non-negative integer') end
  redis.call('HSET', KEYS[1], name, ARGV[3])
  if ttl > 0 then
    redis.call('HSET', KEYS[1], name .. '@until', now_ms() + ttl)
  else
    redis.call('HDEL', KEYS[1], name .. '@until')
  end
else
  redis.call('HDEL', KEYS[1], name, name .. '@until')
end
epoch, version = bump(epoch)
redis.pcall('PUBLISH', ARGV[5], string.match(KEYS[1], '{([^}]*)}') or '')
return version
