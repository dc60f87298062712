//! What the fleet gets back when a part of it, or the store's memory, goes away: the permits of
//! workers killed with `kill -9` (reclaimed within 3 s of their last renewal, with the default
//! configuration), a `FLUSHALL` under load (recognised, handled as an empty restart), and an
//! empty restart after a 429 stepped the limit back (the stepped-back limit is carried back).
//!
//! This test binary is its own worker: run with `WAVEGATE_RECLAIM_ROLE=worker` it becomes one
//! worker process (an actix system with a `Scheduler` in shared mode, default configuration)
//! driven by environment variables; run normally it starts the servers and the workers and
//! checks what the mock provider saw. (`harness = false`: it prints `N passed, M failed`.)

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use wavegate::{Mode, Scheduler, UpstreamConfig, WaveState};
use wavegate_testkit::{MockUpstream, MockUpstreamConfig, RedisServer};

mod common;
use common::{Worker, call_mock, call_until, env, field, run_scenarios, wait_for_mode};

const ROLE: &str = "WAVEGATE_RECLAIM_ROLE";
const PERMITS: &str = "wavegate:{mock}:permits";
const LIMIT: usize = 10;

fn main() {
    if std::env::var(ROLE).is_ok() {
        worker_main();
        return;
    }
    let scenarios: [(&str, fn()); 3] = [
        (
            "two_killed_workers_permits_come_back_within_three_seconds",
            two_killed_workers_permits_come_back_within_three_seconds,
        ),
        ("a_flushall_under_load_is_an_empty_restart", a_flushall_under_load_is_an_empty_restart),
        ("an_empty_restart_carries_back_a_stepped_back_limit", an_empty_restart_carries_back_a_stepped_back_limit),
    ];
    run_scenarios(&scenarios);
}

/// Workers calling the mock with `callers` callers each for `duration`, default configuration.
fn spawn_workers(
    redis: &RedisServer,
    mock: &MockUpstream,
    count: usize,
    callers: usize,
    duration: Duration,
) -> Vec<Worker> {
    (0..count)
        .map(|_| {
            let env = [
                ("REDIS_URL", redis.url()),
                ("MOCK_ADDR", mock.addr().to_string()),
                ("CALLERS", callers.to_string()),
                ("DURATION_MS", duration.as_millis().to_string()),
            ];
            Worker::spawn(ROLE, &env)
        })
        .collect()
}

fn permits(con: &mut redis::Connection) -> Vec<String> {
    redis::cmd("ZRANGE").arg(PERMITS).arg(0).arg(-1).query(con).expect("ZRANGE")
}

/// Calls that reached the mock in `[from, to)`, per second.
fn rate(mock: &MockUpstream, from: Instant, to: Instant) -> f64 {
    let calls = mock.arrivals().into_iter().filter(|at| *at >= from && *at < to).count();
    calls as f64 / (to - from).as_secs_f64()
}

fn two_killed_workers_permits_come_back_within_three_seconds() {
    let redis = RedisServer::start().expect("redis-server");
    let mock =
        MockUpstream::start(MockUpstreamConfig { service_time: Duration::from_millis(100), ..Default::default() })
            .expect("mock upstream");
    let mut workers = spawn_workers(&redis, &mock, 4, 10, Duration::from_secs(16));
    let mut con = redis.connection().expect("connection");
    std::thread::sleep(Duration::from_secs(5));

    for worker in &mut workers[..2] {
        worker.child.kill().expect("kill -9");
    }
    let killed = Instant::now();
    for worker in &mut workers[..2] {
        let _ = worker.child.wait();
    }
    let at_kill: HashSet<String> = permits(&mut con).into_iter().collect();
    // The survivors' calls last 100 ms: a permit listed at the kill and still listed 500 ms
    // later is a killed worker's.
    std::thread::sleep(Duration::from_millis(500).saturating_sub(killed.elapsed()));
    let orphans: Vec<String> = permits(&mut con).into_iter().filter(|id| at_kill.contains(id)).collect();
    let mut full_again = None;
    while killed.elapsed() < Duration::from_secs(10) {
        let listed: HashSet<String> = permits(&mut con).into_iter().collect();
        if mock.in_flight() >= LIMIT && !orphans.iter().any(|id| listed.contains(id)) {
            full_again = Some(killed.elapsed());
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    std::thread::sleep(Duration::from_secs(8).saturating_sub(killed.elapsed()));
    let before = rate(&mock, killed - Duration::from_secs(4), killed);
    let after = rate(&mock, killed + Duration::from_secs(4), killed + Duration::from_secs(8));
    for worker in &workers[2..] {
        let line = worker.expect_line("RESULT", Duration::from_secs(60));
        assert_eq!(field(&line, "err"), 0, "{line}");
    }
    println!(
        "    the killed workers held {} permits; the survivors had {LIMIT} of {LIMIT} {} after kill -9; \
         {before:.0} calls/s in the 4 s before, {after:.0} in the 4 s from 4 s after ({:.0} %)",
        orphans.len(),
        full_again.map_or("not within 10 s".to_owned(), |at| format!("{:.2} s", at.as_secs_f64())),
        after / before * 100.0
    );
    assert!(!orphans.is_empty(), "the killed workers should have held permits");
    let full_again = full_again.expect("the survivors never had every permit");
    assert!(full_again <= Duration::from_millis(3_500), "{LIMIT} of {LIMIT} only {full_again:?} after the kill");
    assert!(after >= before * 0.9, "{after:.0} calls/s after the kill, {before:.0} before");
}

fn a_flushall_under_load_is_an_empty_restart() {
    const PROCESSES: usize = 4;
    let redis = RedisServer::start().expect("redis-server");
    let mock = MockUpstream::start(MockUpstreamConfig { service_time: Duration::from_secs(2), ..Default::default() })
        .expect("mock upstream");
    let workers = spawn_workers(&redis, &mock, PROCESSES, 5, Duration::from_secs(14));
    let mut con = redis.connection().expect("connection");
    std::thread::sleep(Duration::from_secs(5));

    // What each process holds at the flush, read in the same transaction.
    let (listed, ()): (Vec<String>, ()) = redis::pipe()
        .atomic()
        .cmd("ZRANGE")
        .arg(PERMITS)
        .arg(0)
        .arg(-1)
        .cmd("FLUSHALL")
        .query(&mut con)
        .expect("FLUSHALL");
    mock.reset_max_in_flight();
    let flushed = Instant::now();
    let mut held: HashMap<String, usize> = HashMap::new();
    for id in &listed {
        let instance = id.rsplit_once(':').map_or(id.as_str(), |(instance, _)| instance);
        *held.entry(instance.to_owned()).or_default() += 1;
    }
    let share = LIMIT / PROCESSES;
    // The fallback's bound: each process at most max(its share, what it held at the switch).
    let bound: usize = held.values().map(|&h| h.max(share)).sum::<usize>() + share * (PROCESSES - held.len());
    let mut rebuilt = None;
    while flushed.elapsed() < Duration::from_secs(6) {
        let count: usize = redis::cmd("ZCARD").arg(PERMITS).query(&mut con).expect("ZCARD");
        if rebuilt.is_none() && count >= listed.len().min(LIMIT - 1) {
            rebuilt = Some(flushed.elapsed());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let max = mock.max_in_flight();
    let mut ok = 0;
    for worker in &workers {
        let line = worker.expect_line("RESULT", Duration::from_secs(60));
        assert_eq!(field(&line, "err"), 0, "no call may fail because of the flush: {line}");
        ok += field(&line, "ok");
    }
    let generation: Option<String> =
        redis::cmd("HGET").arg("wavegate:{mock}:wave").arg("gen").query(&mut con).expect("HGET");
    let left: usize = redis::cmd("ZCARD").arg(PERMITS).query(&mut con).expect("ZCARD");
    println!(
        "    {} permits held at the flush ({held:?}); the shared set held them again {}; max at the provider \
         in the 6 s after: {max} (limit {LIMIT}, bound {bound}); {ok} calls, none failed; {left} left after the load",
        listed.len(),
        rebuilt.map_or("never".to_owned(), |at| format!("{:.2} s after", at.as_secs_f64())),
    );
    assert!(listed.len() >= LIMIT - 1, "the limit should have been in use at the flush: {}", listed.len());
    assert!(max <= bound, "{max} calls at once at the provider after the flush; the bound is {bound}");
    assert!(rebuilt.is_some_and(|at| at < Duration::from_secs(3)), "the shared set was not rebuilt: {rebuilt:?}");
    assert!(generation.is_some(), "the state has a generation again");
    assert_eq!(left, 0, "no permit is left once the load ends");
}

fn an_empty_restart_carries_back_a_stepped_back_limit() {
    let mut redis = RedisServer::start().expect("redis-server");
    // A hidden capacity of 3 at a configured limit of 4: the fourth call at once gets a 429.
    let mock = MockUpstream::start(MockUpstreamConfig {
        capacity: Some(3),
        service_time: Duration::from_millis(300),
        retry_after: "1".into(),

        ..Default::default()
    })
    .expect("mock upstream");
    let mut con = redis.connection().expect("connection");
    let limit_in_store = |con: &mut redis::Connection| -> Option<u32> {
        redis::cmd("HGET").arg("wavegate:{mock}:wave").arg("limit").query(con).expect("HGET")
    };
    let system = actix::System::new();
    let (stepped_back, after_restart, status) = system.block_on(async {
        let upstream = UpstreamConfig::builder("mock").limit(4).build().expect("config");
        let scheduler = Scheduler::builder().upstream(upstream).redis(redis.url()).build().expect("scheduler");
        let handle = scheduler.upstream("mock").expect("configured");
        let addr = mock.addr();
        let calls: Vec<_> = (0..4)
            .map(|_| {
                let handle = handle.clone();
                actix::spawn(async move { handle.request().call(move |_| call_mock(addr)).await })
            })
            .collect();
        for call in calls {
            call.await.expect("task").expect("every call ends well (the 429 is retried)");
        }
        assert!(mock.rate_limited() >= 1, "the hidden capacity should have answered a 429");
        let stepped_back = limit_in_store(&mut con);

        redis.kill().expect("kill -9 redis");
        wait_for_mode(&scheduler, Mode::Fallback, Duration::from_secs(5)).await;
        redis.restart().expect("restart, empty");
        wait_for_mode(&scheduler, Mode::Shared, Duration::from_secs(10)).await;
        let mut con = redis.connection().expect("connection");
        let after_restart = limit_in_store(&mut con);
        let status = handle.status().await.expect("status");
        (stepped_back, after_restart, (status.state, status.limit))
    });
    println!(
        "    limit in the store after the 429: {stepped_back:?} (configured 4); after an empty restart and the \
         reconciliation: {after_restart:?}; status {status:?}"
    );
    let stepped_back = stepped_back.expect("the store keeps the state");
    assert!(stepped_back < 4, "the 429 should have stepped the limit back: {stepped_back}");
    assert_eq!(after_restart, Some(stepped_back), "the stepped-back limit is carried back");
    assert_eq!(status, (WaveState::Degraded, stepped_back));
}

// ------------------------------------------------------------------------------------------
// The worker's side.

fn worker_main() {
    let system = actix::System::new();
    system.block_on(async {
        let mock: SocketAddr = env("MOCK_ADDR").parse().expect("MOCK_ADDR");
        let upstream = UpstreamConfig::builder("mock").build().expect("the default configuration");
        let scheduler = Scheduler::builder().upstream(upstream).redis(env("REDIS_URL")).build().expect("scheduler");
        let handle = scheduler.upstream("mock").expect("configured");
        let callers: usize = env("CALLERS").parse().expect("CALLERS");
        let until = Instant::now() + Duration::from_millis(env("DURATION_MS").parse().expect("DURATION_MS"));
        let (ok, err, first_error) = call_until(&handle, mock, callers, until).await;
        println!("RESULT ok={ok} err={err} first_error={first_error:?}");
    });
}
