//! Live changes across a fleet of real processes on one real Redis: a new limit reaches every
//! process within a second, the provider's calls in flight follow it, an override reverts to
//! the configured limit, a process built with another limit adopts the fleet's, no call is
//! lost and no permit leaks.
//!
//! This test binary is its own worker (`WAVEGATE_LIVE_ROLE=worker`): a process with a
//! `Scheduler` in shared mode whose callers call the mock provider until told `STOP`, printing
//! `APPLIED version=V limit=L configured=C at_ms=T` each time it applies new live settings.
//! The orchestrator changes the limit through a scheduler of its own (no load) and reads the
//! mock's most calls in flight from one second after each change. (`harness = false`.)
//!
//! `a_flushall_starts_the_live_settings_over`: after a `FLUSHALL` the store's versions start
//! over; a change made since at a version a process applied before is still applied (the
//! settings' epoch is new), and with no change since every process goes back to its
//! configured limit.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use wavegate::{ClassSetting, ErrorKind, LiveChange, LiveSetting, Scheduler, Upstream, UpstreamConfig};
use wavegate_testkit::{MockUpstream, MockUpstreamConfig, RedisServer};

mod common;
use common::{Worker, call_mock, call_while, env, field, run_scenarios};

const ROLE: &str = "WAVEGATE_LIVE_ROLE";
/// How long a new limit may take to reach every process.
const PICK_UP: Duration = Duration::from_secs(1);
/// How long the mock's calls in flight are watched after [`PICK_UP`].
const WATCH: Duration = Duration::from_secs(2);
const CALLERS: usize = 12;
const CONFIGURED: u32 = 8;

fn main() {
    if std::env::var(ROLE).is_ok() {
        worker_main();
        return;
    }
    let scenarios: [(&str, fn()); 6] = [
        ("a_flushall_starts_the_live_settings_over", a_flushall_starts_the_live_settings_over),
        ("a_live_class_weight_shifts_the_shares", a_live_class_weight_shifts_the_shares),
        ("four_processes_follow_a_live_limit_within_a_second", four_processes_follow_a_live_limit_within_a_second),
        ("local_mode_holds_a_live_limit_in_process", local_mode_holds_a_live_limit_in_process),
        ("a_live_rate_keeps_the_budget_exact_across_the_change", a_live_rate_keeps_the_budget_exact_across_the_change),
        ("a_live_burst_keeps_what_was_spent_across_the_change", a_live_burst_keeps_what_was_spent_across_the_change),
    ];
    run_scenarios(&scenarios);
}

fn now_ms() -> u64 {
    u64::try_from(SystemTime::now().duration_since(UNIX_EPOCH).expect("after 1970").as_millis()).expect("ms")
}

/// The orchestrator's own scheduler of the upstream (it makes no calls).
struct Operator {
    runtime: tokio::runtime::Runtime,
    _scheduler: Scheduler,
    upstream: Upstream,
}

impl Operator {
    fn new(redis: &RedisServer) -> Self {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        let scheduler = runtime.block_on(async {
            Scheduler::builder().upstream(config(CONFIGURED)).redis(redis.url()).build().expect("scheduler")
        });
        let upstream = scheduler.upstream("mock").expect("configured");
        Self { runtime, _scheduler: scheduler, upstream }
    }
}

fn config(limit: u32) -> UpstreamConfig {
    UpstreamConfig::builder("mock")
        .limit(limit)
        .call_timeout(Duration::from_secs(10))
        .max_wait(Duration::from_secs(60))
        .total_timeout(Duration::from_secs(120))
        .build()
        .expect("config")
}

fn spawn(redis: &RedisServer, mock: &MockUpstream, limit: u32) -> Worker {
    let env = [
        ("REDIS_URL", redis.url()),
        ("MOCK_ADDR", mock.addr().to_string()),
        ("LIMIT", limit.to_string()),
        ("CALLERS", CALLERS.to_string()),
    ];
    let worker = Worker::spawn(ROLE, &env);
    worker.expect_line("READY", Duration::from_secs(30));
    worker
}

/// Each worker applied `version` at `limit` within [`PICK_UP`] of `changed_ms`; how long the
/// slowest took.
fn all_applied(workers: &[Worker], version: u64, limit: u32, changed_ms: u64) -> u64 {
    let mut slowest = 0;
    for worker in workers {
        let line = worker.expect_line(&format!("APPLIED version={version} "), Duration::from_secs(5));
        assert_eq!(field(&line, "limit"), u64::from(limit), "{line}");
        let took = field(&line, "at_ms").saturating_sub(changed_ms);
        assert!(took <= PICK_UP.as_millis() as u64, "applied {took} ms after the change: {line}");
        slowest = slowest.max(took);
    }
    slowest
}

/// The mock's most calls in flight from [`PICK_UP`] after `changed` for [`WATCH`].
fn max_after(mock: &MockUpstream, changed: Instant) -> usize {
    std::thread::sleep((changed + PICK_UP).saturating_duration_since(Instant::now()));
    mock.reset_max_in_flight();
    std::thread::sleep(WATCH);
    mock.max_in_flight()
}

fn four_processes_follow_a_live_limit_within_a_second() {
    let redis = RedisServer::start().expect("redis-server");
    let mock =
        MockUpstream::start(MockUpstreamConfig { service_time: Duration::from_millis(40), ..Default::default() })
            .expect("mock upstream");
    let operator = Operator::new(&redis);
    let mut workers: Vec<Worker> = (0..3).map(|_| spawn(&redis, &mock, CONFIGURED)).collect();
    let configured = max_after(&mock, Instant::now());
    println!("configured {CONFIGURED}: max in flight {configured}");
    assert!(configured <= CONFIGURED as usize && configured >= CONFIGURED as usize - 1, "{configured}");

    // Down, then up: every process within a second, the provider within a second of it.
    for limit in [3, 12] {
        let (changed, changed_ms) = (Instant::now(), now_ms());
        let version = operator.runtime.block_on(operator.upstream.set_limit(limit)).expect("set");
        let slowest = all_applied(&workers, version, limit, changed_ms);
        let max = max_after(&mock, changed);
        println!("limit {limit} (version {version}): applied by all within {slowest} ms; max in flight {max}");
        assert!(max <= limit as usize, "{max} in flight under a limit of {limit}");
        assert!(max + 1 >= limit as usize, "the new limit {limit} is used: {max}");
    }

    // An override for 4 s, then back to the configured limit (not the 12 set before it).
    let (changed, changed_ms) = (Instant::now(), now_ms());
    let ttl = Duration::from_millis(4_000);
    let overridden = operator.runtime.block_on(operator.upstream.override_limit(5, ttl)).expect("override");
    all_applied(&workers, overridden, 5, changed_ms);
    std::thread::sleep((changed + PICK_UP).saturating_duration_since(Instant::now()));
    mock.reset_max_in_flight();
    std::thread::sleep(Duration::from_millis(1_200));
    let max = mock.max_in_flight();
    println!("override 5 for {ttl:?} (version {overridden}): max in flight {max}");
    assert!(max <= 5, "{max} in flight under an override of 5");
    let ended_ms = changed_ms + 4_000;
    let reverted = overridden + 1;
    let slowest = all_applied(&workers, reverted, CONFIGURED, ended_ms);
    let max = max_after(&mock, changed + ttl);
    println!(
        "override ended (version {reverted}): reverted by all within {slowest} ms of its end; max in flight {max}"
    );
    assert!(max <= CONFIGURED as usize && max + 1 >= CONFIGURED as usize, "back at {CONFIGURED}: {max}");

    // A process built with another limit adopts the fleet's live one.
    let (changed, changed_ms) = (Instant::now(), now_ms());
    let version = operator.runtime.block_on(operator.upstream.set_limit(6)).expect("set");
    assert!(version > reverted);
    all_applied(&workers, version, 6, changed_ms);
    let other = spawn(&redis, &mock, 20);
    let line = other.expect_line(&format!("APPLIED version={version} "), Duration::from_secs(5));
    assert_eq!((field(&line, "limit"), field(&line, "configured")), (6, 20), "{line}");
    workers.push(other);
    let max = max_after(&mock, changed.max(Instant::now()));
    println!("limit 6 with a fourth process configured at 20: max in flight {max}");
    assert!((5..=6).contains(&max), "{max}");

    // Every call succeeded, and nothing is held once the workers are done.
    for worker in &mut workers {
        worker.tell("STOP");
    }
    let mut ok = 0;
    for worker in &workers {
        let line = worker.expect_line("RESULT", Duration::from_secs(30));
        assert_eq!(field(&line, "err"), 0, "a call was lost: {line}");
        ok += field(&line, "ok");
    }
    assert_eq!(ok, mock.served(), "every call the workers count was served once");
    let status = operator.runtime.block_on(operator.upstream.status()).expect("status");
    assert_eq!(status.in_flight_fleet, Some(0), "a permit leaked: {status:?}");
    assert_eq!(mock.in_flight(), 0);
    println!("{ok} calls, none lost; no permit held at the end");
}

/// The upstream's live settings hash and the fleet's channel of live changes, under the
/// default prefix (`<prefix>:{upstream}:live`, `<prefix>:{live:changes}:released`).
const LIVE_KEY: &str = "wavegate:{mock}:live";
const CHANGES: &str = "wavegate:{live:changes}:released";

/// Three processes under load at a live override of version 2. Then, in one transaction (no
/// process can look in between), `FLUSHALL` and two changes as an operator makes them
/// (`lua/live.lua`, announced): the limit 3, then an override of 6 — version 2 again, which
/// every process must apply though it applied a version 2 before. Then a `FLUSHALL` alone:
/// every process goes back to its configured limit within about a second (its scripts find
/// the state gone, it reconciles, and its next look reads settings of no epoch).
fn a_flushall_starts_the_live_settings_over() {
    let redis = RedisServer::start().expect("redis-server");
    let mock =
        MockUpstream::start(MockUpstreamConfig { service_time: Duration::from_millis(40), ..Default::default() })
            .expect("mock upstream");
    let operator = Operator::new(&redis);
    let mut workers: Vec<Worker> = (0..3).map(|_| spawn(&redis, &mock, CONFIGURED)).collect();
    let changed_ms = now_ms();
    let set = operator.runtime.block_on(operator.upstream.set_limit(3)).expect("set");
    all_applied(&workers, set, 3, changed_ms);
    let changed_ms = now_ms();
    let ttl = Duration::from_secs(60);
    let overridden = operator.runtime.block_on(operator.upstream.override_limit(5, ttl)).expect("override");
    assert_eq!(overridden, 2);
    all_applied(&workers, overridden, 5, changed_ms);

    // (a) FLUSHALL, then a change at the version every process applied: applied by all.
    let mut con = redis.connection().expect("connection");
    let sha: String =
        redis::cmd("SCRIPT").arg("LOAD").arg(include_str!("../lua/live.lua")).query(&mut con).expect("SCRIPT LOAD");
    let (changed, changed_ms) = (Instant::now(), now_ms());
    let (_, _, version): ((), u64, u64) = redis::pipe()
        .atomic()
        .cmd("FLUSHALL")
        .cmd("EVALSHA")
        .arg(&sha)
        .arg(1)
        .arg(LIVE_KEY)
        .arg(&["set", "limit", "3", "0", CHANGES])
        .cmd("EVALSHA")
        .arg(&sha)
        .arg(1)
        .arg(LIVE_KEY)
        .arg(&["set", "limit", "6", "60000", CHANGES])
        .query(&mut con)
        .expect("FLUSHALL and two changes");
    assert_eq!(version, overridden, "the versions started over: the same version again");
    let slowest = applied_by_all(&workers, version, 6, changed_ms);
    let max = max_after(&mock, changed);
    println!(
        "FLUSHALL, then an override of 6 at version {version} again: applied by all within {slowest} ms; max in flight {max}"
    );
    assert!((5..=6).contains(&max), "{max} in flight under the override of 6");

    // (b) FLUSHALL alone: the settings are gone, every process is back at its configured limit.
    let (changed, changed_ms) = (Instant::now(), now_ms());
    redis::cmd("FLUSHALL").exec(&mut con).expect("FLUSHALL");
    let slowest = applied_by_all(&workers, 0, CONFIGURED, changed_ms);
    let max = max_after(&mock, changed);
    println!("FLUSHALL alone: back at the configured {CONFIGURED} in all within {slowest} ms; max in flight {max}");
    assert!(max <= CONFIGURED as usize && max + 1 >= CONFIGURED as usize, "back at {CONFIGURED}: {max}");

    for worker in &mut workers {
        worker.tell("STOP");
    }
    let mut ok = 0;
    for worker in &workers {
        let line = worker.expect_line("RESULT", Duration::from_secs(30));
        assert_eq!(field(&line, "err"), 0, "a call was lost: {line}");
        ok += field(&line, "ok");
    }
    println!("{ok} calls, none lost");
}

/// Each worker applied `version` at `limit` within [`PICK_UP`] of `changed_ms` (a process that
/// found the store's state gone looks once it reconciled); how long the slowest took.
fn applied_by_all(workers: &[Worker], version: u64, limit: u32, changed_ms: u64) -> u64 {
    let mut slowest = 0;
    for worker in workers {
        let line = worker.expect_line(&format!("APPLIED version={version} limit={limit} "), Duration::from_secs(5));
        let took = field(&line, "at_ms").saturating_sub(changed_ms);
        assert!(took <= PICK_UP.as_millis() as u64, "applied {took} ms after the change: {line}");
        slowest = slowest.max(took);
    }
    slowest
}

/// Local mode: the live limit is held in process, shared by the schedulers of one namespace;
/// permits held above a lowered limit run to their end and nobody is admitted until fewer are
/// held; an override reverts; a bad value is a typed error.
fn local_mode_holds_a_live_limit_in_process() {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    runtime.block_on(async {
        let prefix = format!("live-local-{}", std::process::id());
        let config =
            || UpstreamConfig::builder("local").limit(4).max_wait(Duration::from_millis(50)).build().expect("config");
        let one = Scheduler::builder().key_prefix(&prefix).upstream(config()).build().expect("scheduler");
        let two = Scheduler::builder().key_prefix(&prefix).upstream(config()).build().expect("scheduler");
        let (a, b) = (one.upstream("local").expect("local"), two.upstream("local").expect("local"));
        let mut held = Vec::new();
        for _ in 0..4 {
            held.push(a.request().acquire().await.expect("a permit under the configured 4"));
        }
        assert_eq!(a.set_limit(2).await.expect("set"), 1);
        // Both schedulers share the in-process gate: the other applies it within its second.
        let started = Instant::now();
        while b.status().await.expect("status").base_limit != 2 {
            assert!(started.elapsed() < PICK_UP, "not applied within a second");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // The four held run on; nobody is admitted until fewer than two are held.
        let refused = b.request().acquire().await.expect_err("at the lowered limit");
        assert_eq!(refused.kind(), ErrorKind::WaitedTooLong);
        held.truncate(2);
        assert!(b.request().acquire().await.is_err(), "two held: still at the limit");
        held.pop();
        held.push(b.request().acquire().await.expect("one held: room for one"));
        held.clear();
        // An override of 6 for 300 ms, then the configured 4 again.
        assert_eq!(a.override_limit(6, Duration::from_millis(300)).await.expect("override"), 2);
        for _ in 0..6 {
            held.push(b.request().acquire().await.expect("under the override"));
        }
        held.clear();
        tokio::time::sleep(Duration::from_millis(1_400)).await;
        let status = a.status().await.expect("status");
        assert_eq!((status.base_limit, status.configured_limit, status.live_version), (4, 4, 3), "reverted");
        for _ in 0..4 {
            held.push(a.request().acquire().await.expect("under the configured 4"));
        }
        assert!(a.request().acquire().await.is_err(), "the override has run out");
        held.clear();
        for bad in [a.set_limit(0).await, a.override_limit(3, Duration::ZERO).await] {
            let error = bad.expect_err("refused");
            assert_eq!((error.kind(), error.code()), (ErrorKind::InvalidSetting, "invalid_setting"), "{error}");
        }
        assert_eq!(a.clear_limit().await.expect("clear"), 4);
    });
}

/// The calls the mock saw from `from` for `window`.
fn arrivals_in(mock: &MockUpstream, from: Instant, window: Duration) -> usize {
    mock.arrivals().into_iter().filter(|at| *at >= from && *at < from + window).count()
}

/// Two schedulers in shared mode under a requests budget of 600 a minute (burst 10), kept
/// saturated; a third changes its rate live. A cut to 120 a minute leaves the empty budget
/// empty (no second burst: the old debt counts as the same 10 requests at the new interval),
/// and a raise to 1,200 a minute goes on at the new rate at once (no stall waiting out the old
/// debt, no fresh burst).
fn a_live_rate_keeps_the_budget_exact_across_the_change() {
    let fleet = BudgetFleet::start("budgeted");
    let load = fleet.saturate(10);
    std::thread::sleep(Duration::from_secs(2));
    let steady = arrivals_in(&fleet.mock, Instant::now() - Duration::from_secs(1), Duration::from_secs(1));
    println!("600 a minute: {steady} calls in the last second");
    assert!((8..=12).contains(&steady), "{steady}");

    // The cut: from the change on, at most the new rate (2 a second) and the one due.
    let cut = fleet.change(LiveSetting::RequestsPerMinute, 120);
    std::thread::sleep(Duration::from_millis(4_200));
    let after_cut = arrivals_in(&fleet.mock, cut, Duration::from_secs(4));
    println!("cut to 120 a minute: {after_cut} calls in the 4 s after it (a second burst would add 8)");
    assert!((6..=10).contains(&after_cut), "{after_cut} calls in 4 s at 2 a second");

    // The raise: the new rate at once (20 a second), neither a stall nor a fresh burst.
    let raised = fleet.change(LiveSetting::RequestsPerMinute, 1_200);
    std::thread::sleep(Duration::from_millis(2_200));
    let after_raise = arrivals_in(&fleet.mock, raised, Duration::from_secs(2));
    println!("raised to 1,200 a minute: {after_raise} calls in the 2 s after it (a stall would leave ~0)");
    assert!((30..=42).contains(&after_raise), "{after_raise} calls in 2 s at 20 a second");
    fleet.stop(load);
}

/// Two schedulers in shared mode on one Redis under a requests budget of 600 a minute, burst
/// 10, in front of a mock answering in 5 ms, and a third that changes settings live (no load).
struct BudgetFleet {
    _redis: RedisServer,
    mock: MockUpstream,
    runtime: tokio::runtime::Runtime,
    name: &'static str,
    a: Scheduler,
    b: Scheduler,
    operator: Upstream,
}

/// The callers keeping a [`BudgetFleet`] saturated, until stopped.
struct Load {
    stop: Arc<AtomicBool>,
    callers: Vec<tokio::task::JoinHandle<(u64, u64)>>,
}

impl BudgetFleet {
    fn start(name: &'static str) -> Self {
        let redis = RedisServer::start().expect("redis-server");
        let mock =
            MockUpstream::start(MockUpstreamConfig { service_time: Duration::from_millis(5), ..Default::default() })
                .expect("mock upstream");
        let runtime =
            tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
        let config = UpstreamConfig::builder(name)
            .limit(50)
            .requests_per_minute(600, 10)
            .max_wait(Duration::from_secs(30))
            .build()
            .expect("config");
        let build = || {
            let _entered = runtime.enter();
            Scheduler::builder().upstream(config.clone()).redis(redis.url()).build().expect("scheduler")
        };
        let (a, b, operator) = (build(), build(), build());
        let operator = operator.upstream(name).expect("configured");
        Self { _redis: redis, mock, runtime, name, a, b, operator }
    }

    /// `each` callers in each of the two schedulers, calling the mock until stopped.
    fn saturate(&self, each: usize) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let addr = self.mock.addr();
        let callers = [&self.a, &self.b]
            .iter()
            .flat_map(|scheduler| (0..each).map(move |_| scheduler.upstream(self.name).expect("configured")))
            .map(|upstream| {
                let stop = stop.clone();
                self.runtime.spawn(async move {
                    let (mut ok, mut err) = (0u64, 0u64);
                    while !stop.load(Ordering::Relaxed) {
                        match upstream.request().call(move |_| call_mock(addr)).await {
                            Ok(()) => ok += 1,
                            Err(_) => err += 1,
                        }
                    }
                    (ok, err)
                })
            })
            .collect();
        Load { stop, callers }
    }

    /// Sets `setting` to `value` live through the operator's scheduler; when it was stored.
    fn change(&self, setting: LiveSetting, value: u64) -> Instant {
        let change = LiveChange::set(setting, value, None).expect("valid");
        let changed = Instant::now();
        self.runtime.block_on(self.operator.change_live(change)).expect("change");
        changed
    }

    /// Stops `load`; no call may have failed.
    fn stop(self, load: Load) {
        load.stop.store(true, Ordering::Relaxed);
        let mut failed = 0;
        for caller in load.callers {
            failed += self.runtime.block_on(caller).expect("caller").1;
        }
        assert_eq!(failed, 0, "no call lost");
        drop((self.a, self.b));
        self.runtime.shutdown_timeout(Duration::from_secs(2));
    }
}

/// Two schedulers in shared mode under a requests budget of 600 a minute (10 a second), burst
/// 10; a third changes its burst live. Cut to 3 while idle: a load that starts then gets 3 at
/// once, not 10. Raised to 30 under the load: 27 more at once (the budget was empty: 3 − 3),
/// then the rate. Cut back to 10 under the load: what the burst of 30 spent stays spent — the
/// budget is 20 in debt and admits nothing for 2 s, then the rate (a reset would admit 10 at
/// once).
fn a_live_burst_keeps_what_was_spent_across_the_change() {
    let fleet = BudgetFleet::start("bursty");
    // Idle, the budget full (10); the cut leaves 3.
    fleet.change(LiveSetting::RequestsBurst, 3);
    std::thread::sleep(Duration::from_millis(200));
    let started = Instant::now();
    let load = fleet.saturate(15);
    std::thread::sleep(Duration::from_millis(2_200));
    let first = arrivals_in(&fleet.mock, started, Duration::from_millis(500));
    let second = arrivals_in(&fleet.mock, started + Duration::from_secs(1), Duration::from_secs(1));
    println!(
        "burst cut to 3 while idle: {first} calls in the load's first 0.5 s (the old burst: 10 + 5), then {second} a second"
    );
    assert!((4..=10).contains(&first), "{first} calls in 0.5 s: 3 at once and 5 by the rate");
    assert!((8..=12).contains(&second), "{second}");

    // Raised under the load: 27 more at once, then the rate.
    let raised = fleet.change(LiveSetting::RequestsBurst, 30);
    std::thread::sleep(Duration::from_millis(1_200));
    let after_raise = arrivals_in(&fleet.mock, raised, Duration::from_secs(1));
    println!("burst raised to 30 under the load: {after_raise} calls in the second after it (no effect: 10)");
    assert!((30..=42).contains(&after_raise), "{after_raise} calls: 27 at once and 10 by the rate");

    // Cut back to 10 under the load (the budget empty at 30): 20 in debt, nothing for 2 s.
    std::thread::sleep(Duration::from_millis(3_000));
    let cut = fleet.change(LiveSetting::RequestsBurst, 10);
    std::thread::sleep(Duration::from_millis(4_200));
    let stalled = arrivals_in(&fleet.mock, cut + Duration::from_millis(100), Duration::from_millis(1_700));
    let then = arrivals_in(&fleet.mock, cut + Duration::from_secs(2), Duration::from_secs(2));
    println!(
        "burst cut to 10 under the load: {stalled} calls in 0.1-1.8 s after it (a reset: 10 at once), then {then} in 2 s"
    );
    assert!(stalled <= 3, "{stalled} calls while the budget pays its debt back");
    assert!((16..=24).contains(&then), "{then} calls in 2 s at 10 a second");
    fleet.stop(load);
}

/// Two priority classes of equal weight share a saturated limit about evenly; a live weight
/// of 4 for one of them shifts the shares to about 4 to 1 within the next seconds, in shared
/// mode (the scripts' choice) and in local mode (the in-process twin's).
fn a_live_class_weight_shifts_the_shares() {
    let redis = RedisServer::start().expect("redis-server");
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    let config = || {
        UpstreamConfig::builder("classed")
            .limit(2)
            .class("a", 1)
            .class("b", 1)
            .max_wait(Duration::from_secs(30))
            .build()
            .expect("config")
    };
    for shared in [true, false] {
        let scheduler = {
            let _entered = runtime.enter();
            let builder = Scheduler::builder().key_prefix(format!("classes-{shared}-{}", std::process::id()));
            let builder = if shared { builder.redis(redis.url()) } else { builder };
            builder.upstream(config()).build().expect("scheduler")
        };
        let upstream = scheduler.upstream("classed").expect("configured");
        let stop = Arc::new(AtomicBool::new(false));
        let grants = Arc::new([std::sync::atomic::AtomicU64::new(0), std::sync::atomic::AtomicU64::new(0)]);
        let callers: Vec<_> = (0..16)
            .map(|n| {
                let (upstream, stop, grants) = (upstream.clone(), stop.clone(), grants.clone());
                runtime.spawn(async move {
                    let class = n % 2;
                    while !stop.load(Ordering::Relaxed) {
                        let permit = upstream.request().priority(["a", "b"][class]).acquire().await.expect("permit");
                        grants[class].fetch_add(1, Ordering::Relaxed);
                        tokio::time::sleep(Duration::from_millis(10)).await;
                        permit.succeeded();
                    }
                })
            })
            .collect();
        let window = |grants: &[std::sync::atomic::AtomicU64; 2]| {
            let before = [grants[0].load(Ordering::Relaxed), grants[1].load(Ordering::Relaxed)];
            std::thread::sleep(Duration::from_secs(2));
            [grants[0].load(Ordering::Relaxed) - before[0], grants[1].load(Ordering::Relaxed) - before[1]]
        };
        std::thread::sleep(Duration::from_millis(500));
        let even = window(&grants);
        let change = LiveChange::set_class("b", ClassSetting::Weight, 4, None).expect("valid");
        runtime.block_on(upstream.change_live(change)).expect("change");
        std::thread::sleep(Duration::from_millis(300));
        let weighted = window(&grants);
        let status = runtime.block_on(upstream.status()).expect("status");
        let weights: Vec<u32> = status.classes.iter().map(|c| c.weight).collect();
        println!(
            "shared {shared}: grants a:b {even:?} at 1:1, {weighted:?} after a live weight of 4 for b; weights now {weights:?}"
        );
        stop.store(true, Ordering::Relaxed);
        for caller in callers {
            runtime.block_on(caller).expect("caller");
        }
        let ratio = |g: [u64; 2]| g[1] as f64 / g[0].max(1) as f64;
        assert!((0.6..=1.6).contains(&ratio(even)), "about even at 1:1: {even:?}");
        assert!((2.8..=5.5).contains(&ratio(weighted)), "about 4:1 after the change: {weighted:?}");
        assert_eq!(weights, [1, 4]);
    }
    runtime.shutdown_timeout(Duration::from_secs(2));
}

// ------------------------------------------------------------------------------------------
// The worker's side.

fn worker_main() {
    let system = actix::System::new();
    system.block_on(async {
        let limit: u32 = env("LIMIT").parse().expect("LIMIT");
        let mock: SocketAddr = env("MOCK_ADDR").parse().expect("MOCK_ADDR");
        let callers: usize = env("CALLERS").parse().expect("CALLERS");
        let scheduler =
            Scheduler::builder().upstream(config(limit)).redis(env("REDIS_URL")).build().expect("scheduler");
        let upstream = scheduler.upstream("mock").expect("configured");
        let stop = Arc::new(AtomicBool::new(false));
        let told = stop.clone();
        std::thread::spawn(move || {
            let mut line = String::new();
            while std::io::stdin().read_line(&mut line).is_ok_and(|n| n > 0) {
                if line.trim() == "STOP" {
                    told.store(true, Ordering::Relaxed);
                    return;
                }
                line.clear();
            }
        });
        report_live(upstream.clone());
        println!("READY");
        let (ok, err, first_error) =
            call_while(&upstream, mock, callers, move |_, _| !stop.load(Ordering::Relaxed)).await;
        scheduler.shutdown().await;
        println!("RESULT ok={ok} err={err} first_error={first_error:?}");
    });
}

/// Prints each version of the live settings this process applies, when it sees it applied
/// (the same version with another limit too: after a `FLUSHALL` the versions start over).
fn report_live(upstream: Upstream) {
    actix::spawn(async move {
        let mut last = (0, 0);
        loop {
            let Ok(status) = upstream.status().await else { return };
            if (status.live_version, status.base_limit) != last {
                last = (status.live_version, status.base_limit);
                println!(
                    "APPLIED version={} limit={} configured={} at_ms={}",
                    status.live_version,
                    status.base_limit,
                    status.configured_limit,
                    now_ms()
                );
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    });
}
