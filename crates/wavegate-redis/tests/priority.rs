//! Priority classes in Redis: `lua/priority.lua` against `wavegate_core::priority`'s table
//! (and one-line mutants of it, which the table must catch), then the acquire and finish
//! scripts choosing a class across two processes on a real redis-server.

use std::time::Duration;

use tokio::runtime::Runtime;
use wavegate_core::priority::{ChoiceCase, PriorityClass, cases, choose_class};
use wavegate_core::tenant;
use wavegate_core::{Admission, DenyReason, UpstreamConfig, WaveSignal};
use wavegate_redis::{ClassAsk, SharedGate, Store, StoreConfig};
use wavegate_testkit::RedisServer;

const PRIORITY_LUA: &str = include_str!("../../../lua/priority.lua");

/// Runs `choose_class` of the Lua source on one case: ARGV = room, the asked classes
/// (comma-separated, 1-based), then (weight, reserved, in flight, demand, since, pass) per class.
const DRIVER: &str = r"
local room = tonumber(ARGV[1])
local asked = {}
for k in string.gmatch(ARGV[2], '[^,]+') do asked[tonumber(k)] = true end
local classes = {}
for i = 3, #ARGV, 6 do
  table.insert(classes, { weight = tonumber(ARGV[i]), reserved = tonumber(ARGV[i + 1]),
    in_flight = tonumber(ARGV[i + 2]), demand = tonumber(ARGV[i + 3]), since = tonumber(ARGV[i + 4]),
    pass = tonumber(ARGV[i + 5]) })
end
local chosen = choose_class(classes, room, asked)
if chosen == nil then return -1 end
return chosen - 1
";

fn lua_choice(con: &mut redis::Connection, source: &str, case: &ChoiceCase) -> redis::RedisResult<Option<usize>> {
    let mut command = redis::cmd("EVAL");
    command.arg(source).arg(0).arg(case.room);
    command.arg(case.asked.iter().map(|k| (k + 1).to_string()).collect::<Vec<_>>().join(","));
    for c in &case.classes {
        command.arg(c.weight).arg(c.reserved).arg(c.in_flight).arg(c.demand).arg(c.since_ms).arg(c.pass);
    }
    let chosen: i64 = command.query(con)?;
    Ok(usize::try_from(chosen).ok())
}

/// The first case on which the Lua source disagrees with the table, if any.
fn disagreement(con: &mut redis::Connection, priority_lua: &str) -> Option<String> {
    let source = format!("{priority_lua}\n{DRIVER}");
    for case in cases() {
        let mut rust = case.classes.clone();
        assert_eq!(choose_class(&mut rust, case.room, |c| case.asked.contains(&c)), case.expect, "{}", case.name);
        match lua_choice(con, &source, &case) {
            Ok(got) if got == case.expect => {}
            Ok(got) => return Some(format!("{}: Lua chose {got:?}, the table says {:?}", case.name, case.expect)),
            Err(error) => return Some(format!("{}: {error}", case.name)),
        }
    }
    None
}

/// Each one-line mutant of `lua/priority.lua` (its original line must be unique) makes `caught`
/// say so.
fn assert_mutants_caught(mutants: &[(&str, &str)], mut caught: impl FnMut(&str) -> bool) {
    for (original, mutant) in mutants {
        assert_eq!(PRIORITY_LUA.matches(original).count(), 1, "the mutant's original line is not unique: {original}");
        assert!(caught(&PRIORITY_LUA.replacen(original, mutant, 1)), "the mutant `{mutant}` was not caught");
    }
}

#[test]
fn the_lua_choice_of_class_passes_the_table() {
    let server = RedisServer::start().expect("redis-server");
    let mut con = server.connection().expect("connection");
    assert_eq!(disagreement(&mut con, PRIORITY_LUA), None);
}

#[test]
fn one_line_mutants_of_the_lua_choice_are_caught() {
    let server = RedisServer::start().expect("redis-server");
    let mut con = server.connection().expect("connection");
    let mutants = [
        (
            "if a_reserved ~= b_reserved then return a_reserved end",
            "if a_reserved ~= b_reserved then return b_reserved end",
        ),
        ("x, y = a.pass + stride(a.weight), b.pass", "x, y = a.pass, b.pass"),
        ("b.pass + stride(b.weight)\n", "b.pass + stride(a.weight)\n"),
        (
            "return math.floor(STRIDE_SCALE / math.max(weight, 1))",
            "return math.floor(STRIDE_SCALE * math.max(weight, 1))",
        ),
        ("x, y = (a.in_flight + 1) * b.reserved", "x, y = (a.in_flight + 1) * b.weight"),
        (
            "if a.since ~= b.since then return a.since < b.since end",
            "if a.since ~= b.since then return a.since > b.since end",
        ),
        ("return ia < ib", "return ia > ib"),
        ("if c.demand > 0 and", "if c.demand >= 0 and"),
        ("class.demand = class.demand - 1\n", "\n"),
        ("then class.pass = class.pass + stride(class.weight) end", "then end"),
        ("if class.in_flight >= class.reserved then class.pass", "if true then class.pass"),
        (
            "for _ = 1, room do\n    local c = next_class(classes)\n    if c == nil then return nil end",
            "for _ = 1, room + 1 do\n    local c = next_class(classes)\n    if c == nil then return nil end",
        ),
    ];
    assert_mutants_caught(&mutants, |mutated| disagreement(&mut con, mutated).is_some());
}

const WAVE_LUA: &str = include_str!("../../../lua/wave.lua");

/// Runs the weighted turns of the Lua source (kept in KEYS[6], as in the scripts) on one case:
/// ARGV = n, the weights, the reserves, then (demand, in flight) per class for each step.
const TURNS_DRIVER: &str = r"
local n = tonumber(ARGV[1])
local config = { classes = {} }
for i = 1, n do
  config.classes[i] = { name = 'c' .. i, weight = tonumber(ARGV[1 + i]) }
end
local chosen = {}
for at = 2 + 2 * n, #ARGV, 2 * n do
  local classes = {}
  for i = 1, n do
    classes[i] = { weight = config.classes[i].weight, reserved = tonumber(ARGV[1 + n + i]),
      demand = tonumber(ARGV[at + i - 1]), in_flight = tonumber(ARGV[at + n + i - 1]), since = 0, pass = 0 }
  end
  local turns = load_turns(config)
  observe_turns(config, turns, classes, true)
  local c = next_class(classes)
  if c and classes[c].in_flight >= classes[c].reserved then turns_granted(config, turns, c) end
  table.insert(chosen, c and c - 1 or -1)
end
return chosen
";

#[test]
fn the_lua_turns_pass_the_table_and_catch_their_mutants() {
    let server = RedisServer::start().expect("redis-server");
    let mut con = server.connection().expect("connection");
    let mut run = |priority_lua: &str| -> Option<String> {
        let source = format!("{priority_lua}\n{TURNS_DRIVER}");
        for (k, case) in wavegate_core::priority::turns_cases().into_iter().enumerate() {
            assert_eq!(case.run(), case.expect, "{}", case.name);
            let turns_key = format!("turns:{k}:{}", priority_lua.len());
            let mut command = redis::cmd("EVAL");
            command.arg(&source).arg(6).arg(&["k1", "k2", "k3", "k4", "k5", turns_key.as_str()][..]);
            command.arg(case.weights.len()).arg(&case.weights).arg(&case.reserved);
            for (demand, in_flight) in &case.steps {
                command.arg(demand).arg(in_flight);
            }
            let got: Vec<i64> = match command.query(&mut con) {
                Ok(got) => got,
                Err(error) => return Some(format!("{}: {error}", case.name)),
            };
            let expect: Vec<i64> = case.expect.iter().map(|c| c.map_or(-1, |c| c as i64)).collect();
            if got != expect {
                return Some(format!("{}: Lua chose {got:?}, the table says {expect:?}", case.name));
            }
        }
        None
    };
    assert_eq!(run(PRIORITY_LUA), None);
    let mutants = [
        ("if waits and not turns.waiting[i] and turns.passes[i] < turns.v then", "if false then"),
        ("  if pass > turns.v then", "  if false then"),
        ("turns.passes[i] = pass + stride(config.classes[i].weight)", "turns.passes[i] = pass"),
        ("turns.waiting[i] = values[2 * i + 1] == '1'", "turns.waiting[i] = true"),
    ];
    assert_mutants_caught(&mutants, |mutated| run(mutated).is_some());
}

#[test]
fn the_lua_class_share_of_a_budget_passes_the_table() {
    let server = RedisServer::start().expect("redis-server");
    let mut con = server.connection().expect("connection");
    let driver =
        "local p = tonumber(ARGV[3])\nreturn { class_share(tonumber(ARGV[1]), p), class_share(tonumber(ARGV[2]), p) }";
    let source = format!("{WAVE_LUA}\n{driver}");
    for case in wavegate_core::class_budget::cases() {
        let got: (u64, u64) = redis::cmd("EVAL")
            .arg(&source)
            .arg(0)
            .arg(case.budget.0)
            .arg(case.budget.1)
            .arg(case.percent)
            .query(&mut con)
            .expect("EVAL");
        assert_eq!(got, (u64::from(case.expect.0), u64::from(case.expect.1)), "{case:?}");
    }
}

/// Runs `next_tenant` of the Lua source on one case: ARGV = (in flight, demand, since) per tenant.
const TENANT_DRIVER: &str = r"
local tenants = {}
for i = 1, #ARGV, 3 do
  table.insert(tenants, { in_flight = tonumber(ARGV[i]), demand = tonumber(ARGV[i + 1]), since = tonumber(ARGV[i + 2]) })
end
local chosen = next_tenant(tenants)
if chosen == nil then return -1 end
return chosen - 1
";

/// The first case on which the Lua tenant choice disagrees with the table, if any.
fn tenant_disagreement(con: &mut redis::Connection, priority_lua: &str) -> Option<String> {
    let source = format!("{priority_lua}\n{TENANT_DRIVER}");
    for case in tenant::cases() {
        assert_eq!(tenant::next_tenant(&case.tenants), case.expect, "{}", case.name);
        let mut command = redis::cmd("EVAL");
        command.arg(&source).arg(0);
        for t in &case.tenants {
            command.arg(t.in_flight).arg(t.demand).arg(t.since_ms);
        }
        match command.query::<i64>(con) {
            Ok(got) if usize::try_from(got).ok() == case.expect => {}
            Ok(got) => return Some(format!("{}: Lua chose {got}, the table says {:?}", case.name, case.expect)),
            Err(error) => return Some(format!("{}: {error}", case.name)),
        }
    }
    None
}

#[test]
fn the_lua_choice_of_tenant_passes_the_table_and_catches_its_mutants() {
    let server = RedisServer::start().expect("redis-server");
    let mut con = server.connection().expect("connection");
    assert_eq!(tenant_disagreement(&mut con, PRIORITY_LUA), None);
    let mutants = [
        ("    if t.demand > 0 then", "    if t.demand >= 0 then"),
        ("t.in_flight < b.in_flight or", "t.in_flight > b.in_flight or"),
        ("and t.since < b.since)", "and t.since > b.since)"),
        ("and t.since < b.since)", "and t.since <= b.since)"),
    ];
    assert_mutants_caught(&mutants, |mutated| tenant_disagreement(&mut con, mutated).is_some());
}

/// Two processes' gates of one upstream with classes `interactive` (weight 3) and `batch`.
fn gates(runtime: &Runtime, server: &RedisServer, limit: u32) -> (SharedGate, SharedGate) {
    let store = runtime.block_on(Store::connect(StoreConfig::new(server.url()))).expect("store");
    let config =
        UpstreamConfig::builder("llm").limit(limit).class("interactive", 3).class("batch", 1).build().expect("valid");
    let gate = |instance: &str| {
        SharedGate::with_budgets(store.clone(), config.name(), config.wave(), config.budgets())
            .with_classes(config.classes(), config.default_class(), config.class_count_window())
            .for_instance(instance)
    };
    (gate("alpha"), gate("beta"))
}

fn ask<'a>(class: &'a str, id: &'a str, waiting: u32) -> ClassAsk<'a> {
    ClassAsk { class, id, tokens: 0, waiting }
}

const LEASE: Duration = Duration::from_secs(30);

#[test]
fn a_freed_permit_goes_to_the_class_below_its_share_whoever_asks_first() {
    let server = RedisServer::start().expect("redis-server");
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let (alpha, beta) = gates(&runtime, &server, 2);
    // beta's batch flood takes the whole limit and keeps 50 callers waiting.
    for n in 1..=2 {
        let id = format!("batch|beta:{n}");
        let (acquired, granted) =
            runtime.block_on(beta.acquire_among(&[ask("batch", &id, 50)], LEASE)).expect("acquire");
        assert!(matches!(acquired.admission, Admission::Granted { .. }), "{acquired:?}");
        assert_eq!(granted.as_deref(), Some(id.as_str()));
    }
    let (acquired, _) =
        runtime.block_on(beta.acquire_among(&[ask("batch", "batch|beta:3", 48)], LEASE)).expect("acquire");
    assert!(matches!(acquired.admission, Admission::Denied { reason: DenyReason::AtLimit, .. }));
    // alpha's interactive caller waits too.
    let (acquired, _) =
        runtime.block_on(alpha.acquire_among(&[ask("interactive", "interactive|alpha:1", 1)], LEASE)).expect("ask");
    assert!(matches!(acquired.admission, Admission::Denied { reason: DenyReason::AtLimit, .. }));
    // The fleet's view per class: (in flight, callers waiting).
    let (_, classes) = runtime.block_on(alpha.status_with_classes()).expect("status");
    assert_eq!(classes, [(0, 1), (2, 48)]);
    // A batch permit ends: beta asks again at once, but the permit is interactive's.
    runtime.block_on(beta.finish_text("batch|beta:1", 1, WaveSignal::Success, 0)).expect("finish");
    let (acquired, granted) =
        runtime.block_on(beta.acquire_among(&[ask("batch", "batch|beta:3", 48)], LEASE)).expect("acquire");
    assert!(
        matches!(acquired.admission, Admission::Denied { reason: DenyReason::AtLimit, .. }),
        "batch took interactive's permit: {acquired:?} {granted:?}"
    );
    let (acquired, granted) =
        runtime.block_on(alpha.acquire_among(&[ask("interactive", "interactive|alpha:1", 1)], LEASE)).expect("acquire");
    assert!(matches!(acquired.admission, Admission::Granted { .. }), "{acquired:?}");
    assert_eq!(granted.as_deref(), Some("interactive|alpha:1"));
    // Interactive waits no more: the next free permit is batch's again.
    runtime.block_on(beta.finish_text("batch|beta:2", 1, WaveSignal::Success, 0)).expect("finish");
    let (acquired, _) =
        runtime.block_on(beta.acquire_among(&[ask("batch", "batch|beta:3", 48)], LEASE)).expect("acquire");
    assert!(matches!(acquired.admission, Admission::Granted { .. }), "{acquired:?}");
}

#[test]
fn one_ask_for_several_classes_gets_the_one_the_fleet_reaches_and_a_dead_waiter_holds_nothing_for_long() {
    let server = RedisServer::start().expect("redis-server");
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let (alpha, beta) = gates(&runtime, &server, 2);
    let both = [ask("batch", "batch|alpha:1", 5), ask("interactive", "interactive|alpha:2", 1)];
    let (acquired, granted) = runtime.block_on(alpha.acquire_among(&both, LEASE)).expect("acquire");
    assert!(matches!(acquired.admission, Admission::Granted { .. }));
    assert_eq!(granted.as_deref(), Some("interactive|alpha:2"), "a full tie: the class listed first");
    let (acquired, granted) =
        runtime.block_on(alpha.acquire_among(&[ask("batch", "batch|alpha:1", 5)], LEASE)).expect("acquire");
    assert!(matches!(acquired.admission, Admission::Granted { .. }));
    assert_eq!(granted.as_deref(), Some("batch|alpha:1"));
    // beta's interactive caller waits, then beta dies (never asks again).
    let (acquired, _) =
        runtime.block_on(beta.acquire_among(&[ask("interactive", "interactive|beta:1", 1)], LEASE)).expect("ask");
    assert!(matches!(acquired.admission, Admission::Denied { .. }));
    runtime.block_on(alpha.finish_text("interactive|alpha:2", 1, WaveSignal::Success, 0)).expect("finish");
    // Interactive holds nothing, batch 1: the free permit is interactive's.
    let batch = [ask("batch", "batch|alpha:3", 4)];
    let (acquired, _) = runtime.block_on(alpha.acquire_among(&batch, LEASE)).expect("acquire");
    assert!(matches!(acquired.admission, Admission::Denied { .. }), "kept for beta's waiting interactive caller");
    // Past the freshness bound (1.5 s) beta's place no longer holds the permit back.
    std::thread::sleep(Duration::from_millis(1_600));
    let (acquired, granted) = runtime.block_on(alpha.acquire_among(&batch, LEASE)).expect("acquire");
    assert!(matches!(acquired.admission, Admission::Granted { .. }), "{acquired:?}");
    assert_eq!(granted.as_deref(), Some("batch|alpha:3"));
    // Asking again with the same id is granted again, not twice.
    let (acquired, granted) = runtime.block_on(alpha.acquire_among(&batch, LEASE)).expect("acquire");
    assert!(matches!(acquired.admission, Admission::Granted { .. }));
    assert_eq!(granted.as_deref(), Some("batch|alpha:3"));
    assert_eq!(acquired.in_flight, 2);
}

/// What a process killed with `kill -9` leaves in Redis: its permits, whose leases were last
/// renewed `renewed_ago` before now and which nobody renews again.
fn leave_dead_permits(server: &RedisServer, gate: &SharedGate, ids: &[&str], renewed_ago: Duration) {
    let mut con = server.connection().expect("connection");
    let (secs, micros): (u64, u64) = redis::cmd("TIME").query(&mut con).expect("TIME");
    let now_ms = secs * 1_000 + micros / 1_000;
    let ends = now_ms + u64::try_from((LEASE - renewed_ago).as_millis()).expect("ms");
    for id in ids {
        let _: () = redis::cmd("ZADD").arg(&gate.keys().permits).arg(ends).arg(*id).query(&mut con).expect("ZADD");
    }
}

/// Limit 10, batch (weight 1) with 30 % reserved: alpha holds 7 interactive permits, a dead
/// process 3 batch permits, beta's batch callers wait; alpha ends one call and asks for
/// interactive again. Returns whether alpha got it (the free permit went to interactive, not to
/// batch's reserve).
fn interactive_takes_the_free_permit(renewed_ago: Duration, dead: [&str; 3]) -> bool {
    let server = RedisServer::start().expect("redis-server");
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let store = runtime.block_on(Store::connect(StoreConfig::new(server.url()))).expect("store");
    // A 30 s lease renewed every second: the count window (27 s ahead) is what tells a dead
    // process's permits apart (with the default 3 s lease the lease itself ends within 3 s).
    let config = UpstreamConfig::builder("llm")
        .limit(10)
        .renewed_lease(LEASE)
        .class("interactive", 3)
        .class("batch", 1)
        .reserve("batch", 30)
        .build()
        .expect("valid");
    let gate = |instance: &str| {
        SharedGate::with_budgets(store.clone(), config.name(), config.wave(), config.budgets())
            .with_classes(config.classes(), config.default_class(), config.class_count_window())
            .for_instance(instance)
    };
    let (alpha, beta) = (gate("alpha"), gate("beta"));
    for n in 1..=7 {
        let id = format!("interactive|alpha:{n}");
        let (acquired, _) =
            runtime.block_on(alpha.acquire_among(&[ask("interactive", &id, 1)], LEASE)).expect("acquire");
        assert!(matches!(acquired.admission, Admission::Granted { .. }), "{acquired:?}");
    }
    leave_dead_permits(&server, &alpha, &dead, renewed_ago);
    let (acquired, _) =
        runtime.block_on(beta.acquire_among(&[ask("batch", "batch|beta:1", 20)], LEASE)).expect("acquire");
    assert!(matches!(acquired.admission, Admission::Denied { reason: DenyReason::AtLimit, .. }), "{acquired:?}");
    runtime.block_on(alpha.finish_text("interactive|alpha:1", 1, WaveSignal::Success, 0)).expect("finish");
    let (acquired, _) = runtime
        .block_on(alpha.acquire_among(&[ask("interactive", "interactive|alpha:8", 20)], LEASE))
        .expect("acquire");
    matches!(acquired.admission, Admission::Granted { .. })
}

#[test]
fn a_killed_process_permits_stop_counting_against_their_class_once_they_are_not_renewed() {
    // Renewed lately (the process lives): batch holds its reserve of 3, and interactive's
    // turn (its pass after the grant, 8 S / 3, before batch's 7 S / 3 + S) takes the permit.
    let dead = ["batch|gamma:1|-", "batch|gamma:2|-", "batch|gamma:3|-"];
    assert!(interactive_takes_the_free_permit(Duration::ZERO, dead));
    // Not renewed for 4 s (with classes a live process renews every second, so the process is
    // gone): batch's 3 dead permits no longer count for it, it is below its reserve, and the
    // free permit is batch's. Before, batch's reserve was held by the dead permits until
    // their lease ended.
    assert!(!interactive_takes_the_free_permit(Duration::from_secs(4), dead));
    // An older release's permits (no tenant field) are renewed every third of their lease, not
    // every second: 4 s without a renewal says nothing about them, and they keep counting.
    let older = ["batch|gamma:1", "batch|gamma:2", "batch|gamma:3"];
    assert!(interactive_takes_the_free_permit(Duration::from_secs(4), older));
}

#[test]
fn classes_that_cannot_work_are_refused_when_configured() {
    assert!(PriorityClass::new("inter|active").is_err(), "'|' separates the class in permit ids");
    let error = UpstreamConfig::builder("llm").class("a", 1).reserve("b", 10).build().expect_err("b was never added");
    assert!(error.to_string().contains("class(name, weight)"), "{error}");
    let error = UpstreamConfig::builder("llm").class("a", 1).default_class("c").build().expect_err("no class c");
    assert!(error.to_string().contains("not one of its classes (a)"), "{error}");
}
