-- priority.lua: which waiting class a free permit goes to, across the fleet.
--
-- The twin of wavegate_core::priority (the same table, wavegate_core::priority::cases, runs
-- against both). Concatenated after wave.lua into acquire.lua and finish.lua; used only when
-- the upstream has classes (config.classes, the 14th config argument).
--
-- Storage, on the keys of the waiting list (KEYS[4], KEYS[5]) plus KEYS[6]:
--   a permit id of class c is '<c>|<instance>:<n>' (ids without a known class count for the
--   default class), so the in-flight permits of each class are read off KEYS[1];
--   a process waiting with callers of class c is the member '<c>|<instance>' of KEYS[4]
--   (score: since when), KEYS[5] (score: when it last asked) and KEYS[6] (hash: how many of
--   its callers of c wait). Only members that asked within PRIORITY_FRESH take part: a process
--   that waits asks again at least every 500 ms, so one that died or stopped waiting holds
--   nothing back for longer than that bound.

-- How recently a waiting process must have asked to take part in the choice (ms).
local PRIORITY_FRESH = 1500

-- The virtual time one grant costs a class of weight 1 (wavegate_core::priority::STRIDE_SCALE).
local STRIDE_SCALE = 1000000

-- What one grant advances the pass of a class of `weight` by.
local function stride(weight)
  return math.floor(STRIDE_SCALE / math.max(weight, 1))
end

-- Whether class a (index ia) comes before class b (index ib); both wait.
local function class_before(a, ia, b, ib)
  local a_reserved = a.in_flight < a.reserved
  local b_reserved = b.in_flight < b.reserved
  if a_reserved ~= b_reserved then return a_reserved end
  local x, y
  if a_reserved then
    -- Both below their reserve: the smaller used part of it, (in flight + 1) / reserved.
    x, y = (a.in_flight + 1) * b.reserved, (b.in_flight + 1) * a.reserved
  else
    -- Weighted turns: the smaller pass after this grant.
    x, y = a.pass + stride(a.weight), b.pass + stride(b.weight)
  end
  if x ~= y then return x < y end
  if a.since ~= b.since then return a.since < b.since end
  return ia < ib
end

-- The waiting class the next free permit goes to (an index), or nil.
local function next_class(classes)
  local best = nil
  for i, c in ipairs(classes) do
    if c.demand > 0 and (best == nil or class_before(c, i, classes[best], best)) then best = i end
  end
  return best
end

-- Hands out `room` permits one by one; returns the first class that `asked` (a set of
-- indices) holds, or nil when the room goes to others first. Updates `classes` as it goes.
local function choose_class(classes, room, asked)
  for _ = 1, room do
    local c = next_class(classes)
    if c == nil then return nil end
    if asked[c] then return c end
    classes[c].in_flight = classes[c].in_flight + 1
    classes[c].demand = classes[c].demand - 1
    classes[c].pass = classes[c].pass + stride(classes[c].weight)
  end
  return nil
end

-- The weighted turns (the twin of wavegate_core::priority::ClassTurns), in KEYS[6] beside the
-- waiting counts: '~v' the virtual time, '~p|<class>' a class's pass, '~w|<class>' '1' while it
-- was waiting at the last choice. ('~' is not allowed in class names.)
local function load_turns(config)
  local fields = { '~v' }
  for _, c in ipairs(config.classes) do
    table.insert(fields, '~p|' .. c.name)
    table.insert(fields, '~w|' .. c.name)
  end
  local values = redis.call('HMGET', KEYS[6], unpack(fields))
  local turns = { v = tonumber(values[1]) or 0, passes = {}, waiting = {} }
  for i = 1, #config.classes do
    turns.passes[i] = tonumber(values[2 * i]) or 0
    turns.waiting[i] = values[2 * i + 1] == '1'
  end
  return turns
end

-- Before a choice: a class that starts waiting is lifted to the virtual time (an idle class
-- banks no credit), one that waits no more is marked idle; sets each class's pass. With
-- `save`, what changed is written back.
local function observe_turns(config, turns, classes, save)
  for i, c in ipairs(classes) do
    local waits = c.demand > 0
    if waits and not turns.waiting[i] and turns.passes[i] < turns.v then
      turns.passes[i] = turns.v
      if save then redis.call('HSET', KEYS[6], '~p|' .. config.classes[i].name, turns.passes[i]) end
    end
    if save and waits ~= turns.waiting[i] then
      redis.call('HSET', KEYS[6], '~w|' .. config.classes[i].name, waits and '1' or '0')
    end
    turns.waiting[i] = waits
    c.pass = turns.passes[i]
  end
end

-- After a grant to class i: the virtual time moves to its pass, which advances by its stride.
local function turns_granted(config, turns, i)
  local pass = turns.passes[i]
  if pass > turns.v then
    turns.v = pass
    redis.call('HSET', KEYS[6], '~v', pass)
  end
  turns.passes[i] = pass + stride(config.classes[i].weight)
  redis.call('HSET', KEYS[6], '~p|' .. config.classes[i].name, turns.passes[i])
end

-- The class name of a permit id or a waiting member ('<class>|...'), or nil.
local function class_of(member)
  return string.match(member, '^([^|]*)|')
end

-- The fleet's classes at `limit`: in flight from the permits, waiting from the fresh members.
-- Also returns the fresh members of each class, in the order they started waiting. With
-- `renewed_only`, a permit counts only while its lease ends at least config.class_window ms
-- ahead: a live process renews its permits every second (with classes), so the permits of a
-- process that was killed stop counting against their class within a few seconds, though they
-- hold their place under the limit until their lease ends.
local function fleet_classes(config, limit, now, renewed_only)
  local classes, members = {}, {}
  for i, c in ipairs(config.classes) do
    classes[i] = { weight = c.weight, reserved = math.floor(limit * c.reserve / 100), in_flight = 0, demand = 0,
                   since = 0, pass = 0 }
    members[i] = {}
  end
  local counted_from = renewed_only and now + config.class_window or '-inf'
  for _, id in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], counted_from, '+inf')) do
    local i = config.class_index[class_of(id) or ''] or config.default_class
    classes[i].in_flight = classes[i].in_flight + 1
  end
  -- Only the members that asked lately (stale ones are never read).
  for _, member in ipairs(redis.call('ZRANGEBYSCORE', KEYS[5], now - PRIORITY_FRESH, '+inf')) do
    local i = config.class_index[class_of(member) or '']
    local since = tonumber(redis.call('ZSCORE', KEYS[4], member))
    if i and since then
      local demand = tonumber(redis.call('HGET', KEYS[6], member)) or 1
      if demand > 0 then
        if classes[i].demand == 0 or since < classes[i].since then classes[i].since = since end
        classes[i].demand = classes[i].demand + demand
        table.insert(members[i], { member = member, demand = demand, since = since })
      end
    end
  end
  for i = 1, #members do
    -- In the order they started waiting (then by name, so the order is the same every time).
    table.sort(members[i], function(x, y)
      if x.since == y.since then return x.member < y.member end
      return x.since < y.since
    end)
  end
  return classes, members
end

-- Puts process `instance` on the waiting list for each class it asks for (keeping the place
-- of one that already waits) and takes it off for the classes it no longer asks for.
local function register_waiting(config, instance, asks, now)
  local asked = {}
  for _, ask in ipairs(asks) do
    local member = ask.class .. '|' .. instance
    asked[member] = true
    redis.call('ZADD', KEYS[4], 'NX', now, member)
    redis.call('ZADD', KEYS[5], now, member)
    redis.call('HSET', KEYS[6], member, ask.demand)
  end
  for _, c in ipairs(config.classes) do
    local member = c.name .. '|' .. instance
    if not asked[member] then
      redis.call('ZREM', KEYS[4], member)
      redis.call('ZREM', KEYS[5], member)
      redis.call('HDEL', KEYS[6], member)
    end
  end
end

-- After a grant of class `class` to `instance`: one caller fewer waits there.
local function granted_waiting(instance, class, demand, now)
  local member = class .. '|' .. instance
  if demand <= 1 then
    redis.call('ZREM', KEYS[4], member)
    redis.call('ZREM', KEYS[5], member)
    redis.call('HDEL', KEYS[6], member)
  else
    -- Its next caller waits from now: to the back of its class's line, so the processes of a
    -- class take turns (each release wakes the one that waited longest).
    redis.call('ZADD', KEYS[4], 'XX', now, member)
    redis.call('HSET', KEYS[6], member, demand - 1)
  end
end

-- The process to wake for a freed permit: the free permits are handed out in order, and the
-- owner of the last one (earlier ones went to processes woken by earlier releases) is the
-- member of its class that waited longest among those not yet served. nil when none waits.
local function process_to_wake(config, limit, now)
  local classes, members = fleet_classes(config, limit, now, true)
  observe_turns(config, load_turns(config), classes, false)
  local room = limit - redis.call('ZCARD', KEYS[1])
  local served, last = {}, nil
  for _ = 1, math.max(room, 1) do
    local c = next_class(classes)
    if c == nil then break end
    served[c] = (served[c] or 0) + 1
    last = c
    classes[c].in_flight = classes[c].in_flight + 1
    classes[c].demand = classes[c].demand - 1
    classes[c].pass = classes[c].pass + stride(classes[c].weight)
  end
  if last == nil then return nil end
  local left = served[last]
  for _, m in ipairs(members[last]) do
    left = left - m.demand
    if left <= 0 then return string.sub(m.member, #class_of(m.member) + 2) end
  end
  return nil
end
