-- priority.lua: which waiting class, and which tenant of it, a free permit goes to, across the
-- fleet.
--
-- The twin of wavegate_core::priority and wavegate_core::tenant (the same tables,
-- wavegate_core::priority::cases and wavegate_core::tenant::cases, run against both).
-- Concatenated after wave.lua into acquire.lua, finish.lua and status.lua; used only when the
-- upstream has classes (config.classes, the 14th config argument).
--
-- Storage, on the keys of the waiting list (KEYS[4], KEYS[5]) plus KEYS[6]:
--   a permit id of class c is '<c>|<instance>:<n>', and '<c>|<instance>:<n>|<tag>' for a
--   caller that named a tenant (tag: wavegate_core::tenant::tenant_tag), so the in-flight
--   permits of each class and tenant are read off KEYS[1] (ids without a known class count
--   for the default class, ids without a tag for the callers that named no tenant, '-');
--   a process waiting with callers of class c is the member '<c>|<instance>' of KEYS[4]
--   (score: since when), KEYS[5] (score: when it last asked) and KEYS[6] (hash: how many of
--   its callers of c wait, and at '<member>>' which tenants they are: '<tag>:<count>,...').
--   Only members that asked within PRIORITY_FRESH take part: a process that waits asks again
--   at least every 500 ms, so one that died or stopped waiting holds nothing back for longer
--   than that bound; finish.lua removes members that have not asked for WAITING_TTL.

-- How recently a waiting process must have asked to take part in the choice (ms;
-- wavegate_core::PRIORITY_FRESH_MS, checked equal by wavegate-redis's tests).
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
  turns.passes[i] = pass + stride(config.classes[i].weight)
  if pass > turns.v then
    turns.v = pass
    redis.call('HSET', KEYS[6], '~v', pass, '~p|' .. config.classes[i].name, turns.passes[i])
  else
    redis.call('HSET', KEYS[6], '~p|' .. config.classes[i].name, turns.passes[i])
  end
end

-- The tag of the callers that name no tenant (wavegate_core::tenant::NO_TENANT).
local NO_TENANT = '-'

-- The tenant tag of a permit id ('<class>|<instance>:<n>|<tag>'), or NO_TENANT.
local function tenant_of(id)
  return string.match(id, '^[^|]*|[^|]*|(.+)$') or NO_TENANT
end

-- The waiting tenant a class's next permit goes to (an index), or nil: the fewest permits in
-- flight, then the longest wait, then the first listed (wavegate_core::tenant::next_tenant).
local function next_tenant(tenants)
  local best = nil
  for i, t in ipairs(tenants) do
    if t.demand > 0 then
      local b = tenants[best]
      if b == nil or t.in_flight < b.in_flight or (t.in_flight == b.in_flight and t.since < b.since) then
        best = i
      end
    end
  end
  return best
end

-- The class name of a permit id or a waiting member ('<class>|...'), or nil.
local function class_of(member)
  return string.match(member, '^([^|]*)|')
end

-- A class's entry for tenant `tag`, created on first sight.
local function tenant_entry(class, tag)
  local t = class.tenant_index[tag]
  if t == nil then
    t = { name = tag, in_flight = 0, demand = 0, since = math.huge, owners = {} }
    table.insert(class.tenants, t)
    class.tenant_index[tag] = t
  end
  return t
end

-- The fleet's classes at `limit`: in flight from the permits, waiting from the fresh members,
-- and per class its tenants (in flight, waiting, and the members waiting for each, in the
-- order they started waiting). With `renewed_only`, a permit counts only while its lease ends
-- at least config.class_window ms ahead: a live process renews its permits every second (with
-- classes), so the permits of a process that was killed stop counting for their class and
-- tenant within a few seconds, though they hold their place under the limit until their lease
-- ends.
local function fleet_classes(config, limit, now, renewed_only)
  local classes = {}
  for i, c in ipairs(config.classes) do
    classes[i] = { weight = c.weight, reserved = math.floor(limit * c.reserve / 100), in_flight = 0, demand = 0,
                   since = 0, pass = 0, tenants = {}, tenant_index = {} }
  end
  -- Only ids with a tenant field ('<c>|<instance>:<n>|<tag>', '-' for none) come from processes
  -- that renew every second; an older process's ('<c>|<instance>:<n>', renewed every third of
  -- its lease) always count.
  local counted_from = renewed_only and now + config.class_window or nil
  local permits = redis.call('ZRANGE', KEYS[1], 0, -1, 'WITHSCORES')
  for k = 1, #permits, 2 do
    local id, ends = permits[k], tonumber(permits[k + 1])
    if counted_from == nil or ends >= counted_from or string.match(id, '^[^|]*|[^|]*|') == nil then
      local class = classes[config.class_index[class_of(id) or ''] or config.default_class]
      class.in_flight = class.in_flight + 1
      local tenant = tenant_entry(class, tenant_of(id))
      tenant.in_flight = tenant.in_flight + 1
    end
  end
  -- Only the members that asked lately (stale ones are never read), and not "later than now"
  -- (a backward jump of TIME): such a member counts again at its next ask, which writes now.
  for _, member in ipairs(redis.call('ZRANGEBYSCORE', KEYS[5], now - PRIORITY_FRESH, now)) do
    local i = config.class_index[class_of(member) or '']
    local since = tonumber(redis.call('ZSCORE', KEYS[4], member))
    if i and since then
      local class = classes[i]
      local values = redis.call('HMGET', KEYS[6], member, member .. '>')
      local offers = {}
      if values[2] then
        for tag, count in string.gmatch(values[2], '([^:,]+):(%d+)') do
          table.insert(offers, { tag = tag, count = tonumber(count) })
        end
      else
        offers[1] = { tag = NO_TENANT, count = tonumber(values[1]) or 1 }
      end
      for _, offer in ipairs(offers) do
        if offer.count > 0 then
          if class.demand == 0 or since < class.since then class.since = since end
          class.demand = class.demand + offer.count
          local tenant = tenant_entry(class, offer.tag)
          tenant.demand = tenant.demand + offer.count
          if since < tenant.since then tenant.since = since end
          table.insert(tenant.owners, { member = member, demand = offer.count, since = since })
        end
      end
    end
  end
  for _, class in ipairs(classes) do
    -- Listed by tag, owners in the order they started waiting (then by name), so the order is
    -- the same every time.
    table.sort(class.tenants, function(x, y) return x.name < y.name end)
    for _, tenant in ipairs(class.tenants) do
      table.sort(tenant.owners, function(x, y)
        if x.since == y.since then return x.member < y.member end
        return x.since < y.since
      end)
    end
  end
  return classes
end

-- A class with a budget of its own (a share of the upstream's, wave.lua) takes no part in the
-- choice while that budget cannot take one more request (and, for the asker's classes, its
-- token estimate; `tokens[c]`): its permit goes to another class that waits, and its own
-- callers ask again at their next poll.
local function cap_classes(config, classes, now, tokens)
  for i, class in ipairs(classes) do
    local own = config.classes[i]
    if class.demand > 0 and own.share < 100 then
      local wait = 0
      if own.requests then wait = select(2, gcra_check(own.requests, load_tat('requests_tat|' .. own.name, own.requests, now * 1000), now * 1000, 1)) end
      if own.tokens then
        local _, w = gcra_check(own.tokens, load_tat('tokens_tat|' .. own.name, own.tokens, now * 1000), now * 1000, tokens[i] or 1)
        wait = math.max(wait, w)
      end
      if wait > 0 then class.demand = 0 end
    end
  end
end

-- After a grant of class i reserving `tokens`: its own budgets are charged too.
local function charge_class(config, i, now, tokens)
  local own = config.classes[i]
  if own == nil or own.share >= 100 then return end
  if own.requests then
    save_tat('requests_tat|' .. own.name, gcra_charge(own.requests, load_tat('requests_tat|' .. own.name, own.requests, now * 1000), now * 1000, 1))
  end
  if own.tokens then
    save_tat('tokens_tat|' .. own.name, gcra_charge(own.tokens, load_tat('tokens_tat|' .. own.name, own.tokens, now * 1000), now * 1000, tokens))
  end
end

-- Settles a token reservation of permit `id` on its class's own tokens budget, if it has one.
local function settle_class(config, id, now, delta)
  local own = config.classes[config.class_index[class_of(id) or ''] or config.default_class]
  if own and own.tokens and delta ~= 0 then
    save_tat('tokens_tat|' .. own.name, gcra_settle(own.tokens, load_tat('tokens_tat|' .. own.name, own.tokens, now * 1000), now * 1000, delta))
  end
end

-- Hands the next permit to class c's next tenant (as if granted): returns the member it goes
-- to (the one of that tenant's that waited longest and is not served yet), or nil.
local function hand_out(classes, c)
  local class = classes[c]
  -- A grant through the reserve is outside the turns (wavegate_core::priority::by_reserve).
  if class.in_flight >= class.reserved then class.pass = class.pass + stride(class.weight) end
  class.in_flight = class.in_flight + 1
  class.demand = class.demand - 1
  local t = next_tenant(class.tenants)
  if t == nil then return nil end
  local tenant = class.tenants[t]
  tenant.in_flight = tenant.in_flight + 1
  tenant.demand = tenant.demand - 1
  for _, owner in ipairs(tenant.owners) do
    if owner.demand > 0 then
      owner.demand = owner.demand - 1
      return owner.member
    end
  end
  return nil
end

-- Hands out `room` permits one by one, to the next class and within it the next tenant; returns
-- the asker's ask the first of them reaches (`asked[class][tag]` is its index), its class and
-- whether it is granted through the class's reserve, or nil when the room goes to others first.
local function choose_grant(classes, room, asked)
  for _ = 1, room do
    local c = next_class(classes)
    if c == nil then return nil end
    local t = next_tenant(classes[c].tenants)
    local tag = t and classes[c].tenants[t].name or NO_TENANT
    if asked[c] and asked[c][tag] then return asked[c][tag], c, classes[c].in_flight < classes[c].reserved end
    hand_out(classes, c)
  end
  return nil
end

-- Hands out `room` permits one by one; returns the first class that `asked` (a set of
-- indices) holds, or nil when the room goes to others first. Updates `classes` as it goes.
-- The choice of class alone (wavegate_core::priority::choose_class, the table's form of
-- choose_grant): no tenants.
local function choose_class(classes, room, asked)
  local by_tag = {}
  for c in pairs(asked) do by_tag[c] = { [NO_TENANT] = c } end
  for _, class in ipairs(classes) do class.tenants = class.tenants or {} end
  local _, c = choose_grant(classes, room, by_tag)
  return c
end

-- Puts process `instance` on the waiting list for each class it asks for (keeping the place
-- of one that already waits), with how many of its callers of each tenant wait, and (with
-- `clear_others`) takes it off for the classes it no longer asks for.
local function register_waiting(config, instance, asks, now, clear_others)
  local by_member, order = {}, {}
  for _, ask in ipairs(asks) do
    local member = ask.class .. '|' .. instance
    local m = by_member[member]
    if m == nil then
      m = { demand = 0, offers = {} }
      by_member[member] = m
      table.insert(order, member)
    end
    m.demand = m.demand + ask.demand
    table.insert(m.offers, tenant_of(ask.id) .. ':' .. ask.demand)
  end
  for _, member in ipairs(order) do
    redis.call('ZADD', KEYS[4], 'NX', now, member)
    redis.call('ZADD', KEYS[5], now, member)
    redis.call('HSET', KEYS[6], member, by_member[member].demand, member .. '>', table.concat(by_member[member].offers, ','))
  end
  if not clear_others then return end
  for _, c in ipairs(config.classes) do
    local member = c.name .. '|' .. instance
    if not by_member[member] then
      redis.call('ZREM', KEYS[4], member)
      redis.call('ZREM', KEYS[5], member)
      redis.call('HDEL', KEYS[6], member, member .. '>')
    end
  end
end

-- A process not on the waiting list yet joins the choice in memory: its asks, as
-- register_waiting would put them, added to the fleet's classes from fleet_classes.
local function add_offers(config, classes, instance, asks, now)
  for _, ask in ipairs(asks) do
    local class = classes[config.class_index[ask.class] or config.default_class]
    if class and ask.demand > 0 then
      if class.demand == 0 or now < class.since then class.since = now end
      class.demand = class.demand + ask.demand
      local tenant = tenant_entry(class, tenant_of(ask.id))
      tenant.demand = tenant.demand + ask.demand
      if now < tenant.since then tenant.since = now end
      table.insert(tenant.owners, { member = ask.class .. '|' .. instance, demand = ask.demand, since = now })
    end
  end
end

-- After a grant of `ask` (one of `asks`) to `instance`: one caller fewer of its class and
-- tenant waits there.
local function granted_waiting(instance, ask, asks, now)
  local member = ask.class .. '|' .. instance
  local waiting = 0
  for _, a in ipairs(asks) do
    if a.class == ask.class then waiting = waiting + a.demand end
  end
  local granted, left, offers = tenant_of(ask.id), 0, {}
  -- The common case, its last caller of the class: no need to read what it offered.
  local listed = waiting > 1 and redis.call('HGET', KEYS[6], member .. '>') or ''
  for tag, count in string.gmatch(listed, '([^:,]+):(%d+)') do
    count = tonumber(count)
    if tag == granted then
      count = count - 1
      granted = nil
    end
    if count > 0 then
      left = left + count
      table.insert(offers, tag .. ':' .. count)
    end
  end
  if left <= 0 then
    redis.call('ZREM', KEYS[4], member)
    redis.call('ZREM', KEYS[5], member)
    redis.call('HDEL', KEYS[6], member, member .. '>')
  else
    -- Its next caller waits from now: to the back of its class's line, so the processes of a
    -- class take turns (each release wakes the one that waited longest).
    redis.call('ZADD', KEYS[4], 'XX', now, member)
    redis.call('HSET', KEYS[6], member, left, member .. '>', table.concat(offers, ','))
  end
end

-- The process to wake for a freed permit: the free permits are handed out in order (class,
-- then tenant), and the owner of the last one (earlier ones went to processes woken by earlier
-- releases) is the member of its tenant that waited longest among those not yet served. nil
-- when none waits.
local function process_to_wake(config, limit, now)
  -- Nobody waits (a single caller's release, say): nothing to choose.
  if redis.call('ZCOUNT', KEYS[5], now - PRIORITY_FRESH, now) == 0 then return nil end
  local classes = fleet_classes(config, limit, now, true)
  cap_classes(config, classes, now, {})
  observe_turns(config, load_turns(config), classes, false)
  local room = limit - redis.call('ZCARD', KEYS[1])
  local last = nil
  for _ = 1, math.max(room, 1) do
    local c = next_class(classes)
    if c == nil then break end
    last = hand_out(classes, c) or last
  end
  if last == nil then return nil end
  return string.sub(last, #class_of(last) + 2)
end
