//! The twins agree on random scenarios of several processes at one gate: `LocalGate` and the
//! scripts, driven by the same steps at the same times, answer the same — every decision (the
//! ask it names included), every release (whom it wakes included), every renewal and every
//! status with its per-class counts.
//!
//! The scripts run with their `now_ms()` reading a key the test sets (the only change to
//! them), and each call is exactly what [`calls`](crate::calls) builds for `SharedGate`, read
//! by its readers. One-line mutants of the acquire, finish and priority scripts must make the
//! twins disagree.

use std::collections::HashMap;
use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use redis::{Script, Value};
use wavegate_core::priority::PriorityClass;
use wavegate_core::{
    Admission, DenyReason, Instance, LearnedLimit, LearnedLimits, LocalGate, PermitId, Recovery, ServedSpan, TenantTag,
    TokenDelta, UpstreamConfig, UpstreamName, WaveSignal, WindowLeft, WindowReport, WindowsBack,
};
use wavegate_testkit::RedisServer;

use crate::calls::{self, Call, HandOff, Head};
use crate::connection::{Store, StoreConfig};
use crate::scripts::source;
use crate::shared_gate::SharedGate;

const CLOCK_NOW: &str = "local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end";

const TEST_NOW: &str = "local function now_ms()
  return tonumber(redis.call('GET', KEYS[2] .. ':clock'))
end";

/// The scripts under test, on the test's clock.
struct Scripts {
    acquire: Script,
    finish: Script,
    renew: Script,
    status: Script,
    report_window: Script,
}

/// The scripts as sent, their clock replaced, `mutate` applied to their text.
fn scripts(mutate: &dyn Fn(&str) -> String) -> Scripts {
    let on_test_clock = |source: &str| {
        assert_eq!(source.matches(CLOCK_NOW).count(), 1, "wave.lua's now_ms() changed: update the test");
        Script::new(&mutate(&source.replacen(CLOCK_NOW, TEST_NOW, 1)))
    };
    Scripts {
        acquire: on_test_clock(source::ACQUIRE),
        finish: on_test_clock(source::FINISH),
        renew: on_test_clock(source::RENEW),
        status: on_test_clock(source::STATUS),
        report_window: on_test_clock(source::REPORT_WINDOW),
    }
}

/// One class of a scenario: weight, reserve %, budget %.
#[derive(Debug, Clone, Copy)]
struct ClassIn {
    weight: u32,
    reserve: u8,
    budget: u8,
}

#[derive(Debug, Clone)]
struct Scenario {
    limit: u32,
    classes: Vec<ClassIn>,
    default: usize,
    requests: Option<(u32, u32)>,
    tokens: Option<(u32, u32)>,
    adaptive: bool,
    lease_ms: u64,
    /// The classes' count window: 0, or 300 ms short of the lease.
    windowed: bool,
    steps: Vec<StepIn>,
}

#[derive(Debug, Clone)]
enum StepIn {
    /// Process `instance` asks for its heads of these (class, tenant) pairs, with new callers
    /// `more` and the tokens each head reserves.
    Ask {
        instance: usize,
        heads: Vec<(usize, usize, u32, u64)>,
    },
    /// The `pick`-th held permit ends: 0 success (a third of them served below the limit:
    /// `ServedSuccess`, half of those with a span), 1 neutral, 2 a 429 (a third of them among
    /// the fleet's served calls: `RateLimitedAmong`); with a token delta.
    Finish {
        pick: usize,
        outcome: u8,
        delta: i64,
    },
    /// The permits at these picks renew (and one the gates never saw).
    Renew {
        picks: Vec<usize>,
    },
    /// A response says what is left of the requests window and announces a tokens limit; the
    /// window is a fixed one, or (`refills_to`) a bucket refilled continuously to that limit.
    Report {
        requests_left: Option<u64>,
        tokens_limit: Option<u64>,
        refills_to: Option<u64>,
    },
    Advance {
        ms: u64,
    },
}

fn scenario() -> impl Strategy<Value = Scenario> {
    let class = (
        1u32..=4,
        prop_oneof![3 => Just(0u8), 1 => Just(25u8), 1 => Just(50u8)],
        prop_oneof![4 => Just(100u8), 1 => Just(50u8)],
    )
        .prop_map(|(weight, reserve, budget)| ClassIn { weight, reserve, budget });
    let step = prop_oneof![
        6 => (0usize..3, proptest::collection::vec((0usize..3, 0usize..3, 1u32..4, prop_oneof![6 => 0u64..400, 1 => 0u64..1_500]), 1..4))
            .prop_map(|(instance, heads)| StepIn::Ask { instance, heads }),
        4 => (0usize..8, prop_oneof![6 => Just(0u8), 2 => Just(1u8), 1 => Just(2u8)], -400i64..100)
            .prop_map(|(pick, outcome, delta)| StepIn::Finish { pick, outcome, delta }),
        1 => proptest::collection::vec(0usize..8, 0..3).prop_map(|picks| StepIn::Renew { picks }),
        1 => (proptest::option::of(0u64..4), proptest::option::of(500u64..5_000), proptest::option::of(1u64..7))
            .prop_map(|(requests_left, tokens_limit, refills_to)| StepIn::Report { requests_left, tokens_limit, refills_to }),
        3 => prop_oneof![8 => 0u64..20, 4 => 0u64..700, 2 => 0u64..3_000, 1 => 8_000u64..12_000]
            .prop_map(|ms| StepIn::Advance { ms }),
    ];
    (
        1u32..=4,
        proptest::collection::vec(class, 0..=3),
        0usize..3,
        proptest::option::of((60u32..1_200, 1u32..4)),
        proptest::option::of((6_000u32..60_000, 100u32..1_000)),
        any::<bool>(),
        prop_oneof![Just(2_500u64), Just(60_000u64)],
        any::<bool>(),
        proptest::collection::vec(step, 1..60),
    )
        .prop_map(|(limit, mut classes, default, requests, tokens, adaptive, lease_ms, windowed, steps)| {
            // Reserves add up to at most 100 %.
            let mut total = 0;
            for class in &mut classes {
                if total + u32::from(class.reserve) > 100 {
                    class.reserve = 0;
                }
                total += u32::from(class.reserve);
            }
            let default = default % classes.len().max(1);
            Scenario { limit, classes, default, requests, tokens, adaptive, lease_ms, windowed, steps }
        })
}

const CLASS_NAMES: [&str; 3] = ["gold", "silver", "bronze"];
const TENANTS: [Option<&str>; 3] = [None, Some("acme"), Some("zeta")];

impl Scenario {
    fn config(&self) -> UpstreamConfig {
        let mut builder = UpstreamConfig::builder("agree")
            .limit(self.limit)
            .cooldown_ladder([Duration::from_millis(300), Duration::from_millis(900)])
            .min_cooldown(Duration::from_millis(10))
            .max_cooldown(Duration::from_millis(2_000))
            .recovery(if self.adaptive { Recovery::Adaptive } else { Recovery::Seed })
            .retest_spacing(Duration::from_millis(400), Duration::from_millis(1_600));
        if let Some((rate, burst)) = self.requests {
            builder = builder.requests_per_minute(rate, burst);
        }
        if let Some((rate, burst)) = self.tokens {
            builder = builder.tokens_per_minute(rate, burst);
        }
        builder.build().expect("a valid configuration")
    }

    fn classes(&self) -> Vec<PriorityClass> {
        self.classes
            .iter()
            .zip(CLASS_NAMES)
            .map(|(c, name)| {
                PriorityClass::new(name)
                    .and_then(|p| p.weight(c.weight))
                    .and_then(|p| p.reserve_percent(c.reserve))
                    .and_then(|p| p.budget_percent(c.budget))
                    .expect("a valid class")
            })
            .collect()
    }

    fn window(&self) -> Duration {
        if self.windowed { Duration::from_millis(self.lease_ms - 300) } else { Duration::ZERO }
    }
}

/// A head's place: (class, tenant).
type Key = (usize, usize);

/// A process's waiting heads: where → (id, callers waiting).
type Heads = HashMap<Key, (PermitId, u32)>;

/// Runs `scenario` on both twins; the first difference, if any.
fn disagreement(
    con: &mut redis::Connection,
    store: &Store,
    scripts: &Scripts,
    scenario: &Scenario,
    upstream: &str,
) -> Result<(), String> {
    let config = scenario.config();
    let classes = scenario.classes();
    let name = UpstreamName::new(upstream).expect("valid");
    let shared = SharedGate::with_budgets(store.clone(), &name, config.wave(), config.budgets()).with_classes(
        &classes,
        scenario.default,
        scenario.window(),
    );
    let mut local = LocalGate::with_budgets(config.wave().clone(), config.budgets()).with_classes(
        &classes,
        scenario.default,
        scenario.window(),
    );
    let instances: Vec<Instance> = ["i0", "i1", "i2"].iter().map(|n| Instance::new(*n).expect("valid")).collect();
    let lease = Duration::from_millis(scenario.lease_ms);
    let mut now: u64 = 1_700_000_000_000;
    let mut sequence = 0;
    let mut waiting: Vec<Heads> = vec![HashMap::new(); 3];
    let mut held: Vec<(PermitId, u64)> = Vec::new();
    let keys = &shared.keys;
    let clock = format!("{}:clock", keys.wave);
    let eval = |con: &mut redis::Connection, script: &Script, call: &Call<'_>, now: u64| -> Result<Value, String> {
        redis::cmd("SET").arg(&clock).arg(now).exec(con).map_err(|e| e.to_string())?;
        call.invocation(script).invoke::<Value>(con).map_err(|e| e.to_string())
    };
    let rows = |value: Value| match value {
        Value::Array(rows) => Ok(rows),
        other => Err(format!("not an array: {other:?}")),
    };
    for (index, step) in scenario.steps.iter().enumerate() {
        let at = |what: String| format!("step {index} ({step:?}): {what}");
        match step {
            StepIn::Ask { instance, heads } => {
                let me = &instances[*instance];
                // Without classes a process has one head.
                let key_of = |class: usize, tenant: usize| {
                    if classes.is_empty() { (0, 0) } else { (class % classes.len(), tenant) }
                };
                for (class, tenant, more, _) in heads {
                    let key = key_of(*class, *tenant);
                    let head = waiting[*instance].entry(key).or_insert_with(|| {
                        sequence += 1;
                        if classes.is_empty() {
                            (PermitId::new(None, me, sequence, None), 0)
                        } else {
                            let tag = TENANTS[key.1].map(TenantTag::of);
                            (PermitId::new(Some(CLASS_NAMES[key.0]), me, sequence, tag), 0)
                        }
                    });
                    head.1 += more;
                }
                let mut asked: Vec<(&Key, &(PermitId, u32))> = waiting[*instance].iter().collect();
                asked.sort_by_key(|(key, _)| **key);
                let tokens_of = |key: &Key| heads.iter().find(|h| key_of(h.0, h.1) == *key).map_or(0, |h| h.3);
                let asks: Vec<wavegate_core::Ask> = asked
                    .iter()
                    .map(|(key, (id, count))| wavegate_core::Ask {
                        id: id.clone(),
                        tokens: tokens_of(key),
                        output: 0,
                        waiting: *count,
                    })
                    .collect();
                let decision = local.acquire(me, &asks, scenario.lease_ms, now);
                let heads: Vec<Head<'_>> = asks
                    .iter()
                    .map(|a| Head {
                        class: a.id.class().unwrap_or(""),
                        id: a.id.as_str(),
                        tokens: a.tokens,
                        output: a.output,
                        waiting: a.waiting,
                    })
                    .collect();
                let call =
                    calls::acquire(keys, &shared.config_args, (me.as_str(), ""), lease, &heads, !classes.is_empty());
                let reply = rows(eval(con, &scripts.acquire, &call, now).map_err(at)?).map_err(at)?;
                let (k, admission, in_flight, _, _) =
                    calls::read_acquire(&reply, &heads).map_err(|e| at(e.to_string()))?;
                let lua = wavegate_core::Decision::new(asks[k].id.clone(), admission, in_flight);
                if lua != decision {
                    return Err(at(format!("Rust {decision:?}, Lua {lua:?}")));
                }
                let key = asked.iter().find(|(_, (id, _))| id == decision.id()).map(|(key, _)| **key);
                let key = key.expect("the decision names an ask");
                match decision.admission() {
                    Admission::Granted { wave, .. } => {
                        let (id, count) = waiting[*instance].remove(&key).expect("asked");
                        if !held.iter().any(|(h, _)| *h == id) {
                            held.push((id, wave));
                        }
                        if count > 1 {
                            sequence += 1;
                            let next = match classes.is_empty() {
                                true => PermitId::new(None, me, sequence, None),
                                false => PermitId::new(
                                    Some(CLASS_NAMES[key.0]),
                                    me,
                                    sequence,
                                    TENANTS[key.1].map(TenantTag::of),
                                ),
                            };
                            waiting[*instance].insert(key, (next, count - 1));
                        }
                    }
                    Admission::Denied { reason: DenyReason::TokensExceedBurst, .. } => {
                        waiting[*instance].remove(&key);
                    }
                    Admission::Denied { .. } => {}
                }
            }
            StepIn::Finish { pick, outcome, delta } => {
                if held.is_empty() {
                    continue;
                }
                let (id, wave) = held.remove(pick % held.len());
                let ago = |went: u64, ended: u64| {
                    ServedSpan::ago(Duration::from_millis(went), Duration::from_millis(ended), now)
                };
                let signal = match outcome {
                    // Some calls recorded, served or not (a pass's id, in the engine: not held).
                    0 if delta % 5 == 0 => WaveSignal::Went {
                        // Some from a clock ahead of the store's, past what a record keeps.
                        span: match delta % 7 {
                            0 => ServedSpan { went_ms: now + 900, ended_ms: now + delta.unsigned_abs() % 3_000 },
                            _ => ago(delta.unsigned_abs() % 250, delta.unsigned_abs() % 3 * 20),
                        },
                        served: delta % 2 == 0,
                    },
                    0 if delta % 3 == 0 => WaveSignal::ServedSuccess {
                        at_most: (delta.unsigned_abs() % 4) as u32,
                        // Half of them with a span, to count the fleet's served calls beside it.
                        span: (delta % 2 == 0).then(|| ago(delta.unsigned_abs() % 300, delta.unsigned_abs() % 7 * 10)),
                    },
                    0 => WaveSignal::Success,
                    1 => WaveSignal::Neutral,
                    // A third of the 429s among the fleet's served calls (shadow mode in a fleet).
                    _ if delta % 3 == 0 => WaveSignal::RateLimitedAmong {
                        retry_after: (delta % 2 == 0).then(|| Duration::from_millis(400)),
                        span: ago(delta.unsigned_abs() % 200, delta.unsigned_abs() % 5 * 10),
                    },
                    _ => WaveSignal::RateLimited { retry_after: (delta % 2 == 0).then(|| Duration::from_millis(400)) },
                };
                // A 429 gives its reservation back to the windows, or nothing when its report did.
                let settled = match outcome {
                    0 | 1 => TokenDelta::from(*delta),
                    _ => TokenDelta {
                        total: (*delta).min(0),
                        output: (delta / 3).min(0),
                        windows: [WindowsBack::Reservation, WindowsBack::Nothing, WindowsBack::Output]
                            [delta.rem_euclid(3) as usize],
                    },
                };
                // One release in three carries its answer's report (with the permit's mark), as
                // the engine sends them: the Rust twin takes it in just before the release.
                let answer = (pick % 3 == 0).then(|| {
                    let remaining = delta.unsigned_abs() % 20;
                    let left = WindowLeft { remaining, reset_ms: 600, refills_to: (remaining % 2 == 0).then_some(20) };
                    let refused =
                        signal.rate_limited().is_some().then(|| (delta.unsigned_abs() % 50, delta.unsigned_abs() % 7));
                    (WindowReport { requests: Some(left), refused, ..WindowReport::default() }, 10)
                });
                if let Some((report, tokens_each)) = answer {
                    local.report_window(id.as_str(), report, now, tokens_each);
                }
                let report = local.finish(&id, wave, signal, settled, now);
                let call = calls::finish(
                    keys,
                    &shared.config_args,
                    (id.as_str(), ""),
                    HandOff::Always,
                    wave,
                    signal,
                    settled,
                    answer,
                );
                let reply = rows(eval(con, &scripts.finish, &call, now).map_err(at)?).map_err(at)?;
                let lua = calls::read_finish(&reply, wave).map_err(|e| at(e.to_string()))?;
                let rust_handed = report.handed.as_ref().map(|(id, _)| id.clone());
                let rust = (report.held, report.rate_limit, report.transition, report.wake.clone(), rust_handed);
                let got = (lua.held, lua.rate_limit, lua.transition, lua.wake.clone(), lua.handed.clone());
                let states = (report.after.state, report.after.limit, report.after.wave, report.in_flight);
                let lua_states = (lua.status.state, lua.status.limit, lua.status.wave, lua.status.in_flight);
                if rust != got || states != lua_states {
                    return Err(at(format!("Rust {rust:?} {states:?}, Lua {got:?} {lua_states:?}")));
                }
                // A permit handed to a waiting process is held from now on, as a grant would be.
                if let Some((handed, wave)) = report.handed {
                    let owner =
                        waiting.iter().position(|heads| heads.get(&(0, 0)).is_some_and(|(id, _)| *id == handed));
                    let owner = owner.ok_or_else(|| at(format!("{handed:?} handed, but no process waits with it")))?;
                    let (id, count) = waiting[owner].remove(&(0, 0)).expect("found");
                    held.push((id, wave));
                    if count > 1 {
                        sequence += 1;
                        waiting[owner]
                            .insert((0, 0), (PermitId::new(None, &instances[owner], sequence, None), count - 1));
                    }
                }
            }
            StepIn::Renew { picks } => {
                let mut ids: Vec<PermitId> =
                    picks.iter().filter(|_| !held.is_empty()).map(|p| held[p % held.len()].0.clone()).collect();
                ids.dedup();
                if ids.is_empty() {
                    continue;
                }
                let mut rust: Vec<String> =
                    local.renew(&ids, now, scenario.lease_ms).iter().map(|id| id.to_string()).collect();
                let call = calls::renew(keys, (lease, ""), ids.iter().map(PermitId::as_str));
                let mut lua: Vec<String> = match eval(con, &scripts.renew, &call, now).map_err(at)? {
                    Value::Array(rows) => rows
                        .into_iter()
                        .map(|v| match v {
                            Value::BulkString(b) => String::from_utf8_lossy(&b).into_owned(),
                            other => format!("{other:?}"),
                        })
                        .collect(),
                    other => return Err(at(format!("renew replied {other:?}"))),
                };
                rust.sort();
                lua.sort();
                if rust != lua {
                    return Err(at(format!("registered again: Rust {rust:?}, Lua {lua:?}")));
                }
            }
            StepIn::Report { requests_left, tokens_limit, refills_to } => {
                let report = WindowReport {
                    requests: requests_left.map(|remaining| WindowLeft {
                        remaining,
                        reset_ms: 500,
                        refills_to: *refills_to,
                    }),
                    tokens: None,
                    // An even tokens limit comes with Anthropic's input and output windows and
                    // limits too.
                    input: tokens_limit.filter(|l| l % 2 == 0).map(|limit| WindowLeft {
                        remaining: limit / 2,
                        reset_ms: 700,
                        refills_to: Some(limit),
                    }),
                    output: tokens_limit.filter(|l| l % 2 == 0).map(|limit| WindowLeft {
                        remaining: limit / 8,
                        reset_ms: 900,
                        refills_to: Some(limit / 4),
                    }),
                    limits: LearnedLimits {
                        requests: None,
                        tokens: tokens_limit.map(|limit| LearnedLimit { limit, window_ms: 1_000 }),
                        input: tokens_limit
                            .filter(|l| l % 2 == 0)
                            .map(|limit| LearnedLimit { limit, window_ms: 1_000 }),
                        output: tokens_limit
                            .filter(|l| l % 2 == 0)
                            .map(|limit| LearnedLimit { limit: limit / 4, window_ms: 1_000 }),
                    },
                    // An odd count left comes with a refusal of the reporting call.
                    refused: requests_left.filter(|left| left % 2 == 1).map(|left| (left * 100, left * 10)),
                };
                local.report_window("", report, now, 10);
                eval(con, &scripts.report_window, &calls::report_window(keys, "", report, 10, false), now)
                    .map_err(at)?;
            }
            StepIn::Advance { ms } => now += ms,
        }
        // After every step, the same state, in flight and per-class counts.
        let (snapshot, in_flight, classes_now) = local.status_with_classes(now);
        let reply = rows(eval(con, &scripts.status, &calls::status(keys, &shared.config_args), now).map_err(at)?)
            .map_err(at)?;
        let (status, lua_classes) = calls::read_status(&reply).map_err(|e| at(e.to_string()))?;
        let rust = (snapshot.state, snapshot.limit, snapshot.wave, in_flight as u32, classes_now);
        let lua = (status.state, status.limit, status.wave, status.in_flight, lua_classes);
        if rust != lua {
            return Err(at(format!("status: Rust {rust:?}, Lua {lua:?}")));
        }
        let budgets = local.budget_status(now);
        if budgets != status.budgets {
            return Err(at(format!("budgets: Rust {budgets:?}, Lua {:?}", status.budgets)));
        }
    }
    Ok(())
}

/// Runs `cases` random scenarios on both twins with the scripts' text passed through
/// `mutate`; the first disagreement, if any.
/// How many rounds of random scenarios a mutant gets before it counts as not caught.
const MUTANT_ROUNDS: usize = 6;

fn first_disagreement(
    server: &RedisServer,
    store: &Store,
    mutate: &dyn Fn(&str) -> String,
    cases: u32,
) -> Option<String> {
    let scripts = scripts(mutate);
    let con = std::cell::RefCell::new(server.connection().expect("connection"));
    let upstream = std::cell::Cell::new(0u32);
    let mut runner = TestRunner::new(Config { cases, failure_persistence: None, ..Config::default() });
    runner
        .run(&scenario(), |scenario| {
            upstream.set(upstream.get() + 1);
            let name = format!("agree-{}-{}", upstream.get(), rand_suffix());
            disagreement(&mut con.borrow_mut(), store, &scripts, &scenario, &name).map_err(TestCaseError::fail)
        })
        .err()
        .map(|e| format!("{e:?}"))
}

/// A suffix that keeps each run's keys apart (mutants run on the same server).
fn rand_suffix() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

fn connect(server: &RedisServer) -> Store {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    runtime.block_on(Store::connect(StoreConfig::new(server.url()))).expect("store")
}

#[test]
fn the_twins_agree_on_random_scenarios_of_several_processes() {
    let server = RedisServer::start().expect("redis-server");
    let store = connect(&server);
    if let Some(failure) = first_disagreement(&server, &store, &|s| s.to_owned(), 300) {
        panic!("the twins disagree: {failure}");
    }
}

#[test]
fn one_line_mutants_of_the_scripts_make_the_twins_disagree() {
    let server = RedisServer::start().expect("redis-server");
    let store = connect(&server);
    // (original, mutant): each original line occurs once in the scripts' sources.
    let mutants = [
        // acquire.lua: the never-fitting ask, its class's share, the denial's id.
        ("if a.tokens > burst then", "if a.tokens > burst + 1000 then"),
        ("if own and own.tokens then burst = math.min(burst, own.tokens.burst) end", ""),
        ("  result = { 0, denial, wait, in_flight, id }", "  result = { 0, denial, wait, in_flight, asks[#asks].id }"),
        // acquire.lua: the in-memory join, the list after a grant.
        ("if deferred then add_offers(config, fleet, instance, asks, now) end", ""),
        ("asked_tokens[c] = math.max(asked_tokens[c] or 0, a.tokens)", "asked_tokens[c] = 0"),
        ("local demand = a.demand - (a == ask and 1 or 0)", "local demand = a.demand"),
        // priority.lua: freshness, the count window, the wake, the list after a grant.
        (
            "redis.call('ZRANGEBYSCORE', KEYS[5], now - PRIORITY_FRESH, now)",
            "redis.call('ZRANGEBYSCORE', KEYS[5], '-inf', '+inf')",
        ),
        ("local counted_from = renewed_only and now + config.class_window or nil", "local counted_from = nil"),
        ("for _ = 1, math.max(room, 1) do", "for _ = 1, 1 do"),
        ("redis.call('ZADD', KEYS[4], 'XX', now, member)", ""),
        ("if class.demand > 0 and own.share < 100 then", "if false then"),
        ("last = hand_out(classes, c) or last", "last = last or hand_out(classes, c)"),
        ("    if tag == granted then\n      count = count - 1", "    if tag == granted then\n      count = count"),
        // fleet.lua: the counts kept as members and permits come and go (each mutant reaches
        // only the kept counts, not their rebuild from the members).
        ("string.format('%013d', since)", "string.format('%013d', 9999999999999 - since)"),
        ("local since = tonumber(sinces[k]) or now", "local since = now"),
        ("local stale = redis.call('ZRANGEBYSCORE', KEYS[5], w.cutoff, '(' .. cutoff)", "local stale = {}"),
        ("      elseif t.since >= since then", "      elseif false then"),
        ("count_member(w, member, now, member_offers", "count_member(w, member, 0, member_offers"),
        (
            "    t.demand, t.owners, t.since = t.demand + offer.count,",
            "    t.demand, t.owners, t.since = t.demand + 1,",
        ),
        (
            "      t.demand, t.owners = math.max(t.demand - offer.count, 0)",
            "      t.demand, t.owners = math.max(t.demand, 0)",
        ),
        ("    redis.call('ZADD', KEYS[4], 'NX', now, instance)", "    redis.call('ZADD', KEYS[4], now, instance)"),
        // finish.lua: the settlement of a class's tokens, the stale members, the wake.
        ("  settle_class(config, id, now, token_delta)", ""),
        ("local gone = redis.call('ZRANGEBYSCORE', KEYS[5], '-inf', now - WAITING_TTL)", "local gone = {}"),
        ("local longest = redis.call('ZPOPMIN', KEYS[4])", "local longest = redis.call('ZPOPMAX', KEYS[4])"),
        // finish.lua: the hand-off, and what the wave admits of it.
        ("  if wave_denial(s, now, redis.call('ZCARD', KEYS[1])) then return nil end", ""),
        ("      if hand_off_rule ~= 'none' then ask = hand_off(longest[1], config, s, now) end", ""),
    ];
    let sources = [source::ACQUIRE, source::FINISH];
    for (original, mutant) in mutants {
        // Once in each script that has it (priority.lua is in both).
        let found: Vec<usize> = sources.iter().map(|s| s.matches(original).count()).collect();
        assert!(found.contains(&1) && found.iter().all(|n| *n <= 1), "the mutant's original line: {original}");
        let mutate = |s: &str| s.replacen(original, mutant, 1);
        // Fresh random scenarios each round until one tells the mutant apart: a mutant that
        // only rare scenarios reach (a class's settlement, a tie on the waiting list) was missed
        // by one round of 300 in some runs. A caught mutant costs one round at most.
        let caught = (0..MUTANT_ROUNDS).any(|_| first_disagreement(&server, &store, &mutate, 300).is_some());
        assert!(caught, "the mutant `{original}` -> `{mutant}` was not caught in {MUTANT_ROUNDS} rounds of 300");
    }
}
