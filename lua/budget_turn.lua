-- budget_turn.lua: the turn at the budgets' next room, so the processes whose waiters the rate
-- budgets or the provider's window refused are served in the order they were refused.
--
-- Not a script on its own: concatenated after learned_limit.lua into every upstream script (see
-- crates/wavegate-redis/src/scripts.rs). The Lua twin of wavegate-core's BudgetTurn
-- (crates/wavegate-core/src/budget_turn.rs); both pass the "budget turn" cases of
-- wavegate_core::spec.
--
-- Fields of the wave state hash (KEYS[2]), read back at most TURN_HORIZON + TURN_STEP ms ahead:
-- turn_instance (the process holding the turn, '' for
-- none), turn_at (ms of Redis TIME: when the budgets have room for it) and turn_line (the
-- processes refused while it held the turn, in order: '<instance>:<when it asks again>,...').
--
-- Rules (issue 23: every process was told when the next room comes, and whichever asked first
-- took it; one process's callers waited 1.6-1.8 x as long as in a fleet that serves in order):
--   * an ask refused by a rate budget or the provider's window takes the turn when nobody holds
--     it; its process holds it until the room it was told of (turn_at = now + wait), the holder
--     refused again moves it; any other process refused joins the line (or moves its time);
--   * while another process holds the turn, an ask the budgets have room for is refused
--     ('earlier_waiter') until turn_at plus TURN_STEP ms (at least TURN_STEP), and joins the
--     line: the room is the holder's;
--   * the holder granted passes the turn to the first in line (at the later of now and the time
--     that one asks again); a process granted without the turn leaves the line;
--   * a refusal for longer than TURN_HORIZON ms takes no turn and no place in line (a holder told
--     so gives the turn up): no turn outlives the waiter that took it by more than that (a caller
--     may leave while its process holds the turn), and an ask needing a day's window does not
--     hold back the asks that fit now;
--   * a holder that has not been granted TURN_GRACE ms past turn_at has given it up (it died,
--     or its caller left): the turn passes on the same way; the line keeps at most TURN_MOST
--     processes (the others race);
--   * with priority classes there is no turn (the fleet's choice of class orders the waiters).

local TURN_GRACE = 250
local TURN_STEP = 10
local TURN_MOST = 64
local TURN_HORIZON = 2000

-- The turn goes to the first in line (at the later of `now` and when it asks again), or nobody.
local function budget_turn_pass(t, now)
  local next_in_line = table.remove(t.line, 1)
  if next_in_line then t.holder, t.at = next_in_line[1], math.max(now, next_in_line[2])
  else t.holder, t.at = nil, 0 end
end

-- The turn as stored at `now` ({ holder = name or nil, at = ms, line = { {name, at}, ... } }),
-- a stale holder passed on.
local function budget_turn_load(now)
  local v = state_read({ 'turn_instance', 'turn_at', 'turn_line' })
  local last = now + TURN_HORIZON + TURN_STEP -- the latest a turn may have been told
  local t = { holder = nil, at = 0, line = {} }
  for name, at in string.gmatch(v[3] or '', '([^,:]+):(%d+)') do
    if #t.line < TURN_MOST then table.insert(t.line, { name, pw_clamp(at, last) }) end
  end
  if v[1] and v[1] ~= '' then t.holder, t.at = v[1], pw_clamp(v[2], last) end
  while t.holder and t.at + TURN_GRACE <= now do budget_turn_pass(t, now) end
  return t
end

local function budget_turn_save(t)
  local line = {}
  for _, entry in ipairs(t.line) do table.insert(line, entry[1] .. ':' .. string.format('%.0f', entry[2])) end
  state_write('turn_instance', t.holder or '', 'turn_at', string.format('%.0f', t.at), 'turn_line',
    table.concat(line, ','))
end

-- Puts `instance` in line asking again at `at` (or moves its time), unless the line is full.
local function budget_turn_queue(t, instance, at)
  for _, entry in ipairs(t.line) do
    if entry[1] == instance then entry[2] = at; return end
  end
  if #t.line < TURN_MOST then table.insert(t.line, { instance, at }) end
end

local function budget_turn_leave(t, instance)
  for i, entry in ipairs(t.line) do
    if entry[1] == instance then table.remove(t.line, i); return end
  end
end

-- `instance` no longer waits: a turn it holds passes on, else it leaves the line.
local function budget_turn_give_up(t, instance, now)
  if t.holder == instance then budget_turn_pass(t, now) else budget_turn_leave(t, instance) end
end

-- How long `instance`'s ask, which the budgets have room for, waits for another process's
-- turn (it joins the line); nil when it may be granted.
local function budget_turn_wait(instance, now)
  if instance == '' then return nil end
  local t = budget_turn_load(now)
  if not t.holder or t.holder == instance then return nil end
  local wait = math.max(t.at - now, 0) + TURN_STEP
  budget_turn_queue(t, instance, now + wait)
  budget_turn_save(t)
  return wait
end

-- `instance`'s ask was refused by a budget or the window for `wait` ms.
local function budget_turn_refused(instance, now, wait)
  if instance == '' then return end
  local t = budget_turn_load(now)
  if wait > TURN_HORIZON then
    -- A long wait is not held against the others: its waiter may leave long before.
    if t.holder ~= instance and #t.line == 0 then return end
    budget_turn_give_up(t, instance, now)
    budget_turn_save(t)
    return
  end
  local at = now + wait
  if not t.holder or t.holder == instance then
    budget_turn_leave(t, instance)
    t.holder, t.at = instance, at
  else
    budget_turn_queue(t, instance, at)
  end
  budget_turn_save(t)
end

-- `instance` was granted: a turn it held passes to the first in line; it leaves the line.
local function budget_turn_granted(instance, now)
  if instance == '' then return end
  local t = budget_turn_load(now)
  if not t.holder and #t.line == 0 then return end -- nothing held, nothing to write (the common case)
  budget_turn_give_up(t, instance, now)
  budget_turn_save(t)
end
