-- fleet.lua: the fleet's counts by class and tenant, kept up to date as permits and waiting
-- members come and go, so that the choice of class (priority.lua) reads a few fields per class
-- and waiting tenant instead of every permit and every waiting member.
--
-- Concatenated after priority.lua into acquire.lua, finish.lua and status.lua.
--
-- Permits: the state's field 'pc' (wave.lua), kept by every script that adds or removes one;
-- pc_counts checks it against the permits and counts again from them when it does not match.
-- Waiting, on the waiting list's keys (see priority.lua for the members themselves):
--   KEYS[6] '#waiting' = '<built ms>;<cutoff ms>;<gen>;<key>=<callers>:<since>:<members>;...',
--     one key '<class>|<tag>' per tenant of a class with counted members waiting;
--   KEYS[6] '<member>@' = '<gen>;<since>;<tag>:<count>,...': the member is counted, since
--     `since`, with these callers (absent, or of another generation: not counted);
--   KEYS[7] (sorted set, every score 0) '<class>|<tag>|<since, 13 digits>|<instance>' per
--     counted member and tenant it waits for: by lexical range, a tenant's members in the order
--     they started waiting (the next head's since when the head leaves; the owner a release wakes).
-- A member is counted from its ask until it is granted its last caller, asks for other classes
-- only, or has not asked for PRIORITY_FRESH (the sweep on each choice: KEYS[5] between the last
-- cutoff and the new one, usually nothing), and counted again at its next ask.
-- (One difference from reading the members at each choice: a member whose last ask lies ahead of
-- now, after a backward jump of TIME, still counts until it goes stale; the scan left it out.)
-- Repair: '#waiting' is built again from the fresh members (KEYS[5], KEYS[4] and the members'
-- fields, as the choice read them before these counts) when it is missing or unreadable, or
-- older than WAITING_REBUILD; the permits' counts likewise after PC_REBUILD. So after a FLUSHALL,
-- an eviction, a hand edit or a process of another configuration the counts are right again
-- within that bound. Values read back are clamped.

-- Built on first use (fleet_lib): Redis runs a whole script at each call, definitions
-- included, and a script of an upstream without classes never needs these. (The body of
-- fleet_build is not indented, so it reads as the file it was.)
local fleet_api = nil
local function fleet_build()

-- How often the waiting counts and the permits' counts are built again from the members (ms).
local WAITING_REBUILD = 5000
local PC_REBUILD = 10000

local fleet = nil -- '#waiting' as this run has it (parsed), nil before it is read
local k6_cache = {} -- KEYS[6] fields as read or written in this run (false: absent)
local k6_set, k6_del = {}, {} -- writes of KEYS[6] not sent yet

local function k6_write(field, value)
  k6_cache[field], k6_set[field], k6_del[field] = value, value, nil
end

local function k6_remove(field)
  k6_cache[field], k6_set[field], k6_del[field] = false, nil, true
end

-- The values of `fields` of KEYS[6] (one HMGET for those this run has not seen).
local function k6_fetch(fields)
  return cached_hmget(KEYS[6], k6_cache, fields)
end

-- Calls `send` with `list` in chunks of `step` (the Lua stack bounds unpack).
local function each_chunk(list, step, send)
  for from = 1, #list, step do send(unpack(list, from, math.min(from + step - 1, #list))) end
end

-- A tenant tag as the order keeps it ('|' and '%' escaped, so a tag is one field).
local function tag_text(tag)
  return (string.gsub(tag, '[%%|]', function(c) return string.format('%%%02X', string.byte(c)) end))
end

-- The first entry of tenant (class, tag) in KEYS[7], and the prefix of its entries.
local function order_prefix(class, tag)
  return class .. '|' .. tag_text(tag) .. '|'
end

local function order_entry(class, tag, since, instance)
  return order_prefix(class, tag) .. string.format('%013d', since) .. '|' .. instance
end

-- What a member offers, from its fields (callers, '<tag>:<count>,...'): one entry per tag with
-- callers waiting, in the order listed.
local function member_offers(demand, listed)
  local raw, merged, list = {}, {}, {}
  if listed then
    for tag, count in string.gmatch(listed, '([^:,]+):(%d+)') do
      table.insert(raw, { tag = tag, count = tonumber(count) })
    end
  else
    raw[1] = { tag = NO_TENANT, count = tonumber(demand) or 1 }
  end
  for _, offer in ipairs(raw) do
    if offer.count > 0 then
      if merged[offer.tag] == nil then
        merged[offer.tag] = { tag = offer.tag, count = 0 }
        table.insert(list, merged[offer.tag])
      end
      merged[offer.tag].count = merged[offer.tag].count + offer.count
    end
  end
  return list
end

local function offers_text(offers)
  local parts = {}
  for _, offer in ipairs(offers) do table.insert(parts, offer.tag .. ':' .. offer.count) end
  return table.concat(parts, ',')
end

-- A member's mark: its since and offers when it is counted in generation `gen`, else nil.
local function mark_of(mark, gen)
  if not mark then return nil end
  local g, since, listed = string.match(mark, '^([^;]+);(%d+);(.*)$')
  if g ~= gen then return nil end
  return tonumber(since), member_offers(nil, listed)
end

local function waiting_parse(text)
  if not text then return nil end
  local built, cutoff, gen, rest = string.match(text, '^(%d+);(%-?%d+);([^;]+);(.*)$')
  if not built then return nil end
  local w = { built = tonumber(built), cutoff = tonumber(cutoff), gen = gen, tenants = {}, dirty = false }
  local consumed = 0
  for key, demand, since, owners in string.gmatch(rest, '([^;=]*)=(%d+):(%d+):(%d+);') do
    consumed = consumed + #key + #demand + #since + #owners + 4
    key = pc_unescape(key)
    local class, tag = string.match(key, '^([^|]*)|(.+)$')
    if class == nil then return nil end
    w.tenants[key] = { class = class, tag = tag, demand = tonumber(demand), since = tonumber(since), owners = tonumber(owners) }
  end
  if consumed ~= #rest then return nil end
  return w
end

local function waiting_text(w)
  local keys = {}
  for key, t in pairs(w.tenants) do
    if t.owners > 0 then table.insert(keys, key) end
  end
  table.sort(keys)
  local parts = { w.built .. ';' .. w.cutoff .. ';' .. w.gen .. ';' }
  for _, key in ipairs(keys) do
    local t = w.tenants[key]
    table.insert(parts, pc_escape(key) .. '=' .. t.demand .. ':' .. t.since .. ':' .. t.owners .. ';')
  end
  return table.concat(parts)
end

-- Sends the writes of KEYS[6] this run has kept (the waiting counts with them).
local function fleet_flush()
  if fleet and fleet.dirty then
    fleet.dirty = false
    k6_write('#waiting', waiting_text(fleet))
  end
  local set, del = {}, {}
  for field, value in pairs(k6_set) do
    table.insert(set, field)
    table.insert(set, value)
  end
  for field in pairs(k6_del) do table.insert(del, field) end
  k6_set, k6_del = {}, {}
  each_chunk(set, 1000, function(...) redis.call('HSET', KEYS[6], ...) end)
  each_chunk(del, 1000, function(...) redis.call('HDEL', KEYS[6], ...) end)
end

-- Counts `member` waiting since `since` with `offers`; its order entries are added to `entries`
-- (score, entry, ...) for the caller to send.
local function count_member(w, member, since, offers, entries, listed)
  local class = class_of(member)
  local instance = string.sub(member, #class + 2)
  for _, offer in ipairs(offers) do
    local key = class .. '|' .. offer.tag
    local t = w.tenants[key]
    if t == nil then
      t = { class = class, tag = offer.tag, demand = 0, since = since, owners = 0 }
      w.tenants[key] = t
    end
    t.demand, t.owners, t.since = t.demand + offer.count, t.owners + 1, math.min(t.since, since)
    table.insert(entries, 0)
    table.insert(entries, order_entry(class, offer.tag, since, instance))
  end
  k6_write(member .. '@', w.gen .. ';' .. since .. ';' .. (listed or offers_text(offers)))
  w.dirty = true
end

-- Takes `member` out of the counts, if it is counted (its mark read before).
local function uncount_member(w, member)
  local since, offers = mark_of(k6_cache[member .. '@'], w.gen)
  if k6_cache[member .. '@'] then k6_remove(member .. '@') end
  if since == nil then return end
  local class = class_of(member)
  local instance = string.sub(member, #class + 2)
  local entries = {}
  for _, offer in ipairs(offers) do table.insert(entries, order_entry(class, offer.tag, since, instance)) end
  each_chunk(entries, 1000, function(...) redis.call('ZREM', KEYS[7], ...) end)
  for _, offer in ipairs(offers) do
    local key = class .. '|' .. offer.tag
    local t = w.tenants[key]
    if t then
      t.demand, t.owners = math.max(t.demand - offer.count, 0), t.owners - 1
      if t.owners <= 0 then
        w.tenants[key] = nil
      elseif t.since >= since then
        -- Its longest waiter left: the next one's since.
        local prefix = order_prefix(class, offer.tag)
        local head = redis.call('ZRANGE', KEYS[7], '[' .. prefix, '[' .. prefix .. '\255', 'BYLEX', 'LIMIT', 0, 1)[1]
        t.since = head and tonumber(string.match(string.sub(head, #prefix + 1), '^(%d+)|'))
        if t.since == nil then w.tenants[key] = nil end
      end
    end
  end
  w.dirty = true
end

-- The waiting counts built again from the fresh members, as the choice read them before.
local function waiting_rebuild(config, now, old_gen)
  local t = redis.call('TIME')
  local gen = t[1] .. string.format('%06d', tonumber(t[2]))
  if gen == old_gen then gen = gen .. '+' end
  local w = { built = now, cutoff = now - PRIORITY_FRESH, gen = gen, tenants = {}, dirty = true }
  redis.call('ZREMRANGEBYSCORE', KEYS[7], '-inf', '+inf')
  -- Only the members that asked lately, and not "later than now" (a backward jump of TIME).
  local members = redis.call('ZRANGEBYSCORE', KEYS[5], now - PRIORITY_FRESH, now)
  local entries = {}
  for from = 1, #members, 500 do
    local chunk = { unpack(members, from, math.min(from + 499, #members)) }
    local sinces = redis.call('ZMSCORE', KEYS[4], unpack(chunk))
    local fields = {}
    for _, member in ipairs(chunk) do
      table.insert(fields, member)
      table.insert(fields, member .. '>')
    end
    local values = k6_fetch(fields)
    for k, member in ipairs(chunk) do
      local since = tonumber(sinces[k])
      if config.class_index[class_of(member) or ''] and since then
        count_member(w, member, since, member_offers(values[2 * k - 1], values[2 * k]), entries, values[2 * k] or nil)
      end
    end
  end
  each_chunk(entries, 1000, function(...) redis.call('ZADD', KEYS[7], ...) end)
  return w
end

-- The waiting counts (from `text` when the caller read '#waiting' already), built again when
-- missing, unreadable or due.
local function waiting_get(config, now, text)
  if fleet then return fleet end
  if text == nil then
    -- With the weighted turns, which the choice reads next (load_turns(config, k6_fetch)).
    local fields = turn_fields(config)
    table.insert(fields, 1, '#waiting')
    text = k6_fetch(fields)[1]
  end
  local w = waiting_parse(text)
  if w == nil or w.built > now or now - w.built >= WAITING_REBUILD then
    w = waiting_rebuild(config, now, w and w.gen)
  else
    for _, t in pairs(w.tenants) do t.since = math.min(t.since, now) end
  end
  fleet = w
  return w
end

-- Members that have not asked for PRIORITY_FRESH stop counting (they count again at their next
-- ask); those that asked between the last cutoff and the new one are read, usually none.
local function waiting_sweep(w, now)
  local cutoff = now - PRIORITY_FRESH
  if cutoff <= w.cutoff then return end
  local stale = redis.call('ZRANGEBYSCORE', KEYS[5], w.cutoff, '(' .. cutoff)
  w.cutoff = cutoff
  if #stale == 0 then return end
  local fields = {}
  for _, member in ipairs(stale) do table.insert(fields, member .. '@') end
  k6_fetch(fields)
  for _, member in ipairs(stale) do uncount_member(w, member) end
  w.dirty = true
end

-- The permits' counts by '<class>|<tag>' (wave.lua's 'pc'), counted again from the permits when
-- they do not match `card` (ZCARD), do not add up, or are due.
local function pc_counts(now, card)
  local p = pc_load()
  if not p or p.total ~= card or p.sum ~= p.total or p.built > now or now - p.built >= PC_REBUILD then
    p = { built = now, total = 0, sum = 0, counts = {} }
    for _, id in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do
      local key = pc_key(id)
      p.counts[key] = (p.counts[key] or 0) + 1
      p.total, p.sum = p.total + 1, p.sum + 1
    end
    pc, pc_dirty = p, true
    pc_flush()
  end
  return p.counts
end

-- The fleet's classes at `limit`: in flight from the permits' counts, waiting from the waiting
-- counts, and per class its tenants (in flight, waiting, since when). `card` is the permits'
-- ZCARD when the caller has it. With `renewed_only`, a permit counts only while its lease ends
-- at least config.class_window ms ahead: a live process renews its permits every second (with
-- classes), so the permits of a process that was killed stop counting for their class and
-- tenant within a few seconds, though they hold their place under the limit until their lease
-- ends. (A tenant's members, the owners, are read when a permit is handed to it: process_to_wake.)
local function fleet_classes(config, limit, now, renewed_only, card)
  local classes = {}
  for i, c in ipairs(config.classes) do
    classes[i] = { weight = c.weight, reserved = math.floor(limit * c.reserve / 100), in_flight = 0, demand = 0,
                   since = 0, pass = 0, tenants = {}, tenant_index = {} }
  end
  -- Per class and tenant; a tenant gets an entry only with permits that count (the order of
  -- the entries breaks ties: add_offers appends the asker's new ones after them).
  local held = {}
  for key, n in pairs(pc_counts(now, card or redis.call('ZCARD', KEYS[1]))) do
    local name, tag = string.match(key, '^([^|]*)|(.*)$')
    local i = config.class_index[name] or config.default_class
    held[i] = held[i] or {}
    held[i][tag] = (held[i][tag] or 0) + n
  end
  -- Only ids with a tenant field ('<c>|<instance>:<n>|<tag>', '-' for none) come from processes
  -- that renew every second; an older process's ('<c>|<instance>:<n>', renewed every third of
  -- its lease) always count. (Every permit left after the purge ends after now.)
  local counted_from = renewed_only and now + config.class_window or nil
  if counted_from and counted_from > now then
    for _, id in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', '(' .. counted_from)) do
      local tags = held[config.class_index[class_of(id) or ''] or config.default_class]
      local tag = tenant_of(id)
      if string.match(id, '^[^|]*|[^|]*|') and tags and tags[tag] then tags[tag] = tags[tag] - 1 end
    end
  end
  for i, tags in pairs(held) do
    for tag, n in pairs(tags) do
      if n > 0 then
        classes[i].in_flight = classes[i].in_flight + n
        tenant_entry(classes[i], tag).in_flight = n
      end
    end
  end
  local w = waiting_get(config, now)
  waiting_sweep(w, now)
  for _, t in pairs(w.tenants) do
    local class = classes[config.class_index[t.class] or 0]
    if class and t.demand > 0 then
      if class.demand == 0 or t.since < class.since then class.since = t.since end
      class.demand = class.demand + t.demand
      local tenant = tenant_entry(class, t.tag)
      tenant.demand = tenant.demand + t.demand
      tenant.since = math.min(tenant.since, t.since)
    end
  end
  -- Listed by tag, so the order is the same every time.
  for _, class in ipairs(classes) do table.sort(class.tenants, function(x, y) return x.name < y.name end) end
  fleet_flush()
  return classes
end

-- Puts process `instance` on the waiting list for each class it asks for (keeping the place
-- of one that already waits), with how many of its callers of each tenant wait, and (with
-- `clear_others`) takes it off for the classes it no longer asks for; the counts follow.
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
  local all = { unpack(order) }
  if clear_others then
    for _, c in ipairs(config.classes) do
      local member = c.name .. '|' .. instance
      if not by_member[member] then table.insert(all, member) end
    end
  end
  local fields = { '#waiting' }
  for _, member in ipairs(all) do
    table.insert(fields, member)
    table.insert(fields, member .. '>')
    table.insert(fields, member .. '@')
  end
  -- With the weighted turns, which a choice reads next (load_turns(config, k6_fetch)).
  for _, field in ipairs(turn_fields(config)) do table.insert(fields, field) end
  local values = k6_fetch(fields)
  local seen = {}
  for _, member in ipairs(order) do
    table.insert(seen, now)
    table.insert(seen, member)
  end
  -- The common case, a process asking again for the same callers: what it offers, its mark
  -- (counted with the same offers in this generation) and the classes it no longer asks for
  -- are as they were; only when it last asked changes.
  local gen = values[1] and string.match(values[1], '^%d+;%-?%d+;([^;]+);')
  local same = gen ~= nil
  for k, member in ipairs(order) do
    local listed = table.concat(by_member[member].offers, ',')
    local g, rest = string.match(values[3 * k + 1] or '', '^([^;]+);%d+;(.*)$')
    if values[3 * k - 1] ~= tostring(by_member[member].demand) or values[3 * k] ~= listed
      or (config.class_index[class_of(member)] and (g ~= gen or rest ~= listed)) then
      same = false
    end
  end
  for k = #order + 1, #all do
    if values[3 * k - 1] or values[3 * k] or values[3 * k + 1] then same = false end
  end
  if same then
    redis.call('ZADD', KEYS[5], unpack(seen))
    return
  end
  local sinces = redis.call('ZMSCORE', KEYS[4], unpack(all))
  local w, entries = nil, {}
  for k, member in ipairs(order) do
    local since = tonumber(sinces[k]) or now
    if not sinces[k] then redis.call('ZADD', KEYS[4], 'NX', now, member) end
    local listed = table.concat(by_member[member].offers, ',')
    if values[3 * k - 1] ~= tostring(by_member[member].demand) or values[3 * k] ~= listed then
      k6_write(member, tostring(by_member[member].demand))
      k6_write(member .. '>', listed)
    end
    if config.class_index[class_of(member)] then
      w = w or waiting_get(config, now, values[1])
      if values[3 * k + 1] ~= w.gen .. ';' .. since .. ';' .. listed then
        uncount_member(w, member)
        count_member(w, member, since, member_offers(nil, listed), entries, listed)
      end
    end
  end
  redis.call('ZADD', KEYS[5], unpack(seen))
  each_chunk(entries, 1000, function(...) redis.call('ZADD', KEYS[7], ...) end)
  local gone = {}
  for k = #order + 1, #all do
    local member = all[k]
    if sinces[k] or values[3 * k - 1] or values[3 * k] or values[3 * k + 1] then
      table.insert(gone, member)
      k6_remove(member)
      k6_remove(member .. '>')
      if values[3 * k + 1] then
        w = w or waiting_get(config, now, values[1])
        uncount_member(w, member)
      end
    end
  end
  if #gone > 0 then
    redis.call('ZREM', KEYS[4], unpack(gone))
    redis.call('ZREM', KEYS[5], unpack(gone))
  end
  fleet_flush()
end

-- After a grant of `ask` (one of `asks`) to `instance`: one caller fewer of its class and
-- tenant waits there.
local function granted_waiting(config, instance, ask, asks, now)
  local member = ask.class .. '|' .. instance
  local waiting = 0
  for _, a in ipairs(asks) do
    if a.class == ask.class then waiting = waiting + a.demand end
  end
  local granted, left, offers = tenant_of(ask.id), 0, {}
  -- The common case, its last caller of the class: no need to read what it offered.
  local listed = waiting > 1 and k6_fetch({ member .. '>' })[1] or ''
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
  k6_fetch({ '#waiting', member .. '@' })
  local w = config.class_index[ask.class] and waiting_get(config, now)
  if w then uncount_member(w, member) end
  if left <= 0 then
    redis.call('ZREM', KEYS[4], member)
    redis.call('ZREM', KEYS[5], member)
    k6_remove(member)
    k6_remove(member .. '>')
    if k6_cache[member .. '@'] then k6_remove(member .. '@') end
  else
    -- Its next caller waits from now: to the back of its class's line, so the processes of a
    -- class take turns (each release wakes the one that waited longest).
    redis.call('ZADD', KEYS[4], 'XX', now, member)
    k6_write(member, tostring(left))
    k6_write(member .. '>', table.concat(offers, ','))
    if w then
      local entries = {}
      local listed = table.concat(offers, ',')
      count_member(w, member, now, member_offers(nil, listed), entries, listed)
      each_chunk(entries, 1000, function(...) redis.call('ZADD', KEYS[7], ...) end)
    end
  end
  fleet_flush()
end

-- Members taken off the waiting list by their instance id or member name (finish.lua: not
-- asked for WAITING_TTL, or woken without classes): one still counted makes the waiting
-- counts due to be built again.
local function forget_counted(members)
  local fields = {}
  for _, member in ipairs(members) do table.insert(fields, member .. '@') end
  local marks = redis.call('HMGET', KEYS[6], unpack(fields))
  local counted = {}
  for i, mark in ipairs(marks) do
    if mark then table.insert(counted, fields[i]) end
  end
  if #counted > 0 then
    table.insert(counted, '#waiting')
    redis.call('HDEL', KEYS[6], unpack(counted))
  end
end

-- Tenant (class, tag)'s counted members in the order they started waiting, the first `n` of
-- them, with their callers of that tenant. Fewer entries than the counts say (the order's key
-- lost or edited) build the counts again, and the members are read from them.
local function tenant_owners(config, now, class, tag, n)
  local prefix = order_prefix(class, tag)
  local read = function()
    return redis.call('ZRANGE', KEYS[7], '[' .. prefix, '[' .. prefix .. '\255', 'BYLEX', 'LIMIT', 0, n)
  end
  local entries = read()
  local counted = fleet.tenants[class .. '|' .. tag]
  if #entries < math.min(n, counted and counted.owners or 0) then
    fleet = waiting_rebuild(config, now, fleet.gen)
    fleet_flush()
    entries = read()
  end
  local owners, fields = {}, {}
  for _, entry in ipairs(entries) do
    local since, instance = string.match(string.sub(entry, #prefix + 1), '^(%d+)|(.*)$')
    if since then
      table.insert(owners, { member = class .. '|' .. instance, demand = 0, since = tonumber(since) })
      table.insert(fields, class .. '|' .. instance .. '@')
    end
  end
  local marks = k6_fetch(fields)
  for i, owner in ipairs(owners) do
    local _, offers = mark_of(marks[i], fleet.gen)
    for _, offer in ipairs(offers or {}) do
      if offer.tag == tag then owner.demand = offer.count end
    end
  end
  return owners
end

-- The process to wake for a freed permit: the free permits are handed out in order (class,
-- then tenant), and the owner of the last one (earlier ones went to processes woken by earlier
-- releases) is the member of its tenant that waited longest among those not yet served. nil
-- when none waits.
local function process_to_wake(config, limit, now)
  -- Nobody waits (a single caller's release, say): nothing to choose.
  if redis.call('ZCOUNT', KEYS[5], now - PRIORITY_FRESH, now) == 0 then return nil end
  local in_flight = redis.call('ZCARD', KEYS[1])
  local classes = fleet_classes(config, limit, now, true, in_flight)
  cap_classes(config, classes, now, {})
  observe_turns(config, load_turns(config, k6_fetch), classes, false)
  local room = limit - in_flight
  for i, class in ipairs(classes) do
    for _, tenant in ipairs(class.tenants) do
      tenant.owners = nil
      tenant.fetch_owners = function() return tenant_owners(config, now, config.classes[i].name, tenant.name, math.max(room, 1)) end
    end
  end
  local last = nil
  for _ = 1, math.max(room, 1) do
    local c = next_class(classes)
    if c == nil then break end
    last = hand_out(classes, c) or last
  end
  if last == nil then return nil end
  return string.sub(last, #class_of(last) + 2)
end

return {
  fleet_classes = fleet_classes, register_waiting = register_waiting, granted_waiting = granted_waiting,
  forget_counted = forget_counted, process_to_wake = process_to_wake, k6_fetch = k6_fetch,
}
end

local function fleet_lib()
  fleet_api = fleet_api or fleet_build()
  return fleet_api
end

-- The functions the scripts call (see fleet_build for each).
local function fleet_classes(...) return fleet_lib().fleet_classes(...) end
local function register_waiting(...) return fleet_lib().register_waiting(...) end
local function granted_waiting(...) return fleet_lib().granted_waiting(...) end
local function forget_counted(...) return fleet_lib().forget_counted(...) end
local function process_to_wake(...) return fleet_lib().process_to_wake(...) end
local function k6_fetch(...) return fleet_lib().k6_fetch(...) end
