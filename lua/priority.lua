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
--   permits of each class and tenant can be told from KEYS[1] (ids without a known class count
--   for the default class, ids without a tag for the callers that named no tenant, '-');
--   a process waiting with callers of class c is the member '<c>|<instance>' of KEYS[4]
--   (score: since when), KEYS[5] (score: when it last asked) and KEYS[6] (hash: how many of
--   its callers of c wait, and at '<member>>' which tenants they are: '<tag>:<count>,...').
--   Only members that asked within PRIORITY_FRESH take part: a process that waits asks again
--   at least every 500 ms, so one that died or stopped waiting holds nothing back for longer
--   than that bound; finish.lua removes members that have not asked for WAITING_TTL.
-- The choice reads the fleet from counts kept as permits and members come and go, not from
-- the permits and the members themselves: fleet.lua, concatenated after this file.

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
-- (`read`, when given, reads the fields instead: fleet.lua reads them with its counts.)
local function turn_fields(config)
  local fields = { '~v' }
  for _, c in ipairs(config.classes) do
    table.insert(fields, '~p|' .. c.name)
    table.insert(fields, '~w|' .. c.name)
  end
  return fields
end

local function load_turns(config, read)
  local values = read and read(turn_fields(config)) or redis.call('HMGET', KEYS[6], unpack(turn_fields(config)))
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
  -- (Read when first needed: fleet.lua's process_to_wake.)
  if tenant.owners == nil then tenant.owners = tenant.fetch_owners() end
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
