//! Real processes sharing one real Redis: the fleet-wide limit, and kill -9 of a process
//! that holds permits.
//!
//! This test binary is its own worker: run with `WAVEGATE_FLEET_ROLE=worker` it becomes one
//! worker process (an actix system with a `Scheduler` in shared mode) driven by environment
//! variables; run normally it starts the servers and the workers and checks what the mock
//! provider saw. (`harness = false`: it prints `N passed, M failed` itself.)

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use wavegate::{Scheduler, UpstreamConfig};
use wavegate_testkit::{MockUpstream, MockUpstreamConfig, RedisServer};

mod common;
use common::{Worker, call_while, env, field, run_scenarios};

const ROLE: &str = "WAVEGATE_FLEET_ROLE";

fn main() {
    if std::env::var(ROLE).is_ok() {
        worker_main();
        return;
    }
    let scenarios: [(&str, fn()); 4] = [
        ("four_processes_never_exceed_the_shared_limit", four_processes_never_exceed_the_shared_limit),
        (
            "kill_9_of_a_holder_frees_its_permits_within_two_leases",
            kill_9_of_a_holder_frees_its_permits_within_two_leases,
        ),
        ("redis_killed_under_load_fails_open_to_fair_shares", redis_killed_under_load_fails_open_to_fair_shares),
        ("four_processes_stay_within_the_requests_budget", four_processes_stay_within_the_requests_budget),
    ];
    run_scenarios(&scenarios);
}

// ------------------------------------------------------------------------------------------
// The orchestrator's side.

/// The settings every worker needs; scenarios add their own after them.
fn worker_env(
    redis: &RedisServer,
    mock: &MockUpstream,
    mode: &str,
    limit: usize,
    lease_ms: u128,
) -> Vec<(&'static str, String)> {
    vec![
        ("REDIS_URL", redis.url()),
        ("MOCK_ADDR", mock.addr().to_string()),
        ("MODE", mode.to_string()),
        ("LIMIT", limit.to_string()),
        ("LEASE_MS", lease_ms.to_string()),
    ]
}

fn four_processes_never_exceed_the_shared_limit() {
    const PROCESSES: usize = 4;
    const CALLERS: usize = 25;
    const CALLS: usize = 2_500;
    const LIMIT: usize = 10;
    let redis = RedisServer::start().expect("redis-server");
    let mock = MockUpstream::start(MockUpstreamConfig { service_time: Duration::from_millis(2), ..Default::default() })
        .expect("mock upstream");
    let started = Instant::now();
    let workers: Vec<Worker> = (0..PROCESSES)
        .map(|_| {
            let mut env = worker_env(&redis, &mock, "calls", LIMIT, 30_000);
            env.extend([("CALLERS", CALLERS.to_string()), ("CALLS", CALLS.to_string())]);
            Worker::spawn(ROLE, &env)
        })
        .collect();
    let mut ok = 0;
    for worker in &workers {
        let line = worker.expect_line("RESULT", Duration::from_secs(180));
        assert_eq!(field(&line, "err"), 0, "{line}");
        ok += field(&line, "ok");
    }
    let elapsed = started.elapsed();
    let max = mock.max_in_flight();
    let mut con = redis.connection().expect("connection");
    let stats: String = redis::cmd("INFO").arg("commandstats").query(&mut con).expect("INFO");
    let calls = |name: &str| -> u64 {
        stats
            .lines()
            .filter(|l| name.is_empty() || l.starts_with(name))
            .filter(|l| l.starts_with("cmdstat_"))
            .filter_map(|l| l.split("calls=").nth(1)?.split(',').next()?.parse::<u64>().ok())
            .sum()
    };
    // EVALSHA/EVAL are what clients send; the commands the scripts run inside are counted too.
    let sent = calls("cmdstat_evalsha:") + calls("cmdstat_eval:") + calls("cmdstat_ping:");
    println!(
        "    redis: {:.2} script calls sent per granted permit ({:.1} commands executed inside)",
        sent as f64 / ok as f64,
        calls("") as f64 / ok as f64
    );
    println!(
        "    {} calls from {PROCESSES} processes x {CALLERS} callers in {:.1} s; mock served {}, max in flight {max} (limit {LIMIT})",
        ok,
        elapsed.as_secs_f64(),
        mock.served()
    );
    assert_eq!(ok as usize, PROCESSES * CALLS);
    assert_eq!(mock.served() as usize, PROCESSES * CALLS);
    assert!(max <= LIMIT, "the mock saw {max} calls at once; the limit is {LIMIT}");
    assert!(max >= LIMIT - 2, "the limit should be used: max in flight was only {max}");
}

fn kill_9_of_a_holder_frees_its_permits_within_two_leases() {
    const LEASE: Duration = Duration::from_secs(2);
    const LIMIT: usize = 4;
    let redis = RedisServer::start().expect("redis-server");
    let mock = MockUpstream::start(MockUpstreamConfig::default()).expect("mock upstream");
    let common = |mode: &str| worker_env(&redis, &mock, mode, LIMIT, LEASE.as_millis());
    let mut con = redis.connection().expect("connection");
    let held = |con: &mut redis::Connection| -> usize {
        redis::cmd("ZCARD").arg("wavegate:{mock}:permits").query(con).expect("ZCARD")
    };

    let mut holder = Worker::spawn(ROLE, &common("hold"));
    holder.expect_line("HOLDING", Duration::from_secs(20));
    assert_eq!(held(&mut con), LIMIT);
    // The watchdog keeps the permits past their lease while the holder lives.
    std::thread::sleep(LEASE + LEASE / 2);
    assert_eq!(held(&mut con), LIMIT, "the lease watchdog should have renewed the permits");

    // Another process waits for a permit; none is free.
    let mut envs = common("calls");
    envs.extend([("CALLERS", "2".to_string()), ("CALLS", "20".to_string())]);
    let other = Worker::spawn(ROLE, &envs);
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(mock.served(), 0, "nothing can be served while the holder holds every permit");

    holder.child.kill().expect("kill -9");
    let killed = Instant::now();
    let _ = holder.child.wait();
    while held(&mut con) == LIMIT {
        assert!(killed.elapsed() < LEASE * 2, "the killed process's permits were not reclaimed within two leases");
        std::thread::sleep(Duration::from_millis(20));
    }
    let reclaimed = killed.elapsed();
    let line = other.expect_line("RESULT", Duration::from_secs(30));
    assert_eq!((field(&line, "ok"), field(&line, "err")), (20, 0), "{line}");
    println!(
        "    permits reclaimed {:.2} s after kill -9 (lease {:?}); the other process went on",
        reclaimed.as_secs_f64(),
        LEASE
    );
}

fn redis_killed_under_load_fails_open_to_fair_shares() {
    const CALLERS_PROCESSES: usize = 3;
    const LIMIT: usize = 9;
    const HELD: usize = 2;
    let mut redis = RedisServer::start().expect("redis-server");
    let mock =
        MockUpstream::start(MockUpstreamConfig { service_time: Duration::from_millis(20), ..Default::default() })
            .expect("mock upstream");
    let common = |mode: &str| {
        let mut env = worker_env(&redis, &mock, mode, LIMIT, 3_000);
        env.extend([("HOLD", HELD.to_string()), ("CALLERS", "12".to_string()), ("CALLS", "600".to_string())]);
        env
    };
    let holder = Worker::spawn(ROLE, &common("hold"));
    holder.expect_line("HOLDING", Duration::from_secs(20));
    let callers: Vec<Worker> = (0..CALLERS_PROCESSES).map(|_| Worker::spawn(ROLE, &common("calls"))).collect();
    // Let every process heartbeat so each knows there are four of them.
    std::thread::sleep(Duration::from_millis(1_500));
    assert!(mock.max_in_flight() <= LIMIT - HELD, "healthy: {} > {}", mock.max_in_flight(), LIMIT - HELD);

    redis.kill().expect("kill -9 redis");
    let killed = Instant::now();
    for worker in callers.iter().chain([&holder]) {
        worker.expect_line("MODE fallback", Duration::from_secs(5));
    }
    let switched = killed.elapsed();
    // From here on every call was admitted by a fallback share: the calls admitted in shared
    // mode before the kill (up to the limit, 20 ms each) have ended long since.
    mock.reset_max_in_flight();
    std::thread::sleep(Duration::from_millis(1_500));
    let max_during_outage = mock.max_in_flight();
    let shares = (CALLERS_PROCESSES + 1) * (LIMIT / (CALLERS_PROCESSES + 1));

    redis.restart().expect("restart redis, empty");
    let restarted = Instant::now();
    for worker in callers.iter().chain([&holder]) {
        worker.expect_line("MODE shared", Duration::from_secs(10));
    }
    let back = restarted.elapsed();
    let mut ok = 0;
    for worker in &callers {
        let line = worker.expect_line("RESULT", Duration::from_secs(120));
        assert_eq!(field(&line, "err"), 0, "no call may fail because of the outage: {line}");
        ok += field(&line, "ok");
    }
    let mut con = redis.connection().expect("connection");
    let shared: usize = redis::cmd("ZCARD").arg("wavegate:{mock}:permits").query(&mut con).expect("ZCARD");
    println!(
        "    all {CALLERS_PROCESSES} callers in fallback {:.0} ms after kill -9; max in flight during the outage \
         {max_during_outage} (fair shares sum to {shares}, limit {LIMIT}); all back in shared mode {:.0} ms \
         after the restart; {ok} calls, none failed; shared set after the load: {shared} (held: {HELD})",
        switched.as_secs_f64() * 1e3,
        back.as_secs_f64() * 1e3
    );
    assert!(
        max_during_outage <= shares,
        "{max_during_outage} in flight during the outage; fair shares sum to {shares}"
    );
    assert_eq!(ok as usize, CALLERS_PROCESSES * 600);
    assert_eq!(shared, HELD, "the shared set must hold exactly the permits still in flight (the holder's)");
}

fn four_processes_stay_within_the_requests_budget() {
    const PER_MINUTE: usize = 600; // ten a second
    const BURST: usize = 10;
    const SECONDS: u64 = 6;
    let redis = RedisServer::start().expect("redis-server");
    let mock = MockUpstream::start(MockUpstreamConfig::default()).expect("mock upstream");
    let workers: Vec<Worker> = (0..4)
        .map(|_| {
            let mut env = worker_env(&redis, &mock, "calls", 50, 30_000);
            env.extend([
                ("CALLERS", "5".into()),
                ("CALLS", "1000000".into()),
                ("DURATION_MS", (SECONDS * 1000).to_string()),
                ("RPM", format!("{PER_MINUTE},{BURST}")),
            ]);
            Worker::spawn(ROLE, &env)
        })
        .collect();
    for worker in &workers {
        let line = worker.expect_line("RESULT", Duration::from_secs(60));
        assert_eq!(field(&line, "err"), 0, "{line}");
    }
    let arrivals = mock.arrivals();
    let per_second = PER_MINUTE / 60;
    // In every sliding window of w seconds (the minute, scaled down), at most rate × w + burst.
    let mut worst = Vec::new();
    for window_s in [1u64, 3, SECONDS] {
        let window = Duration::from_secs(window_s);
        let most = (0..arrivals.len())
            .map(|i| arrivals[i..].iter().take_while(|t| t.duration_since(arrivals[i]) < window).count())
            .max()
            .unwrap_or(0);
        let allowed = per_second * window_s as usize + BURST;
        assert!(most <= allowed, "{most} requests in a {window_s} s window; the budget allows {allowed}");
        worst.push(format!("{most}/{allowed} in {window_s} s"));
    }
    let span = arrivals.last().map(|l| l.duration_since(arrivals[0])).unwrap_or_default();
    let rate = (arrivals.len().saturating_sub(BURST)) as f64 / span.as_secs_f64();
    println!(
        "    4 processes against {PER_MINUTE}/min (burst {BURST}): {} requests over {:.1} s, {rate:.2}/s after the burst \
         (budget {per_second}/s); most seen in a sliding window: {}",
        arrivals.len(),
        span.as_secs_f64(),
        worst.join(", ")
    );
    assert!(rate >= per_second as f64 * 0.85, "the budget should be used: {rate:.2}/s");
}

// ------------------------------------------------------------------------------------------
// The worker's side.

fn worker_main() {
    let system = actix::System::new();
    system.block_on(async {
        let limit: u32 = env("LIMIT").parse().expect("LIMIT");
        let lease = Duration::from_millis(env("LEASE_MS").parse().expect("LEASE_MS"));
        let mock: SocketAddr = env("MOCK_ADDR").parse().expect("MOCK_ADDR");
        let mut upstream = UpstreamConfig::builder("mock")
            .limit(limit)
            .renewed_lease(lease)
            .call_timeout(Duration::from_secs(10))
            .max_wait(Duration::from_secs(60))
            .total_timeout(Duration::from_secs(120));
        if let Ok(rpm) = std::env::var("RPM") {
            let (per_minute, burst) = rpm.split_once(',').expect("RPM=per_minute,burst");
            upstream = upstream.requests_per_minute(per_minute.parse().expect("rate"), burst.parse().expect("burst"));
        }
        let upstream = upstream.build().expect("config");
        let until = std::env::var("DURATION_MS")
            .ok()
            .map(|ms| Instant::now() + Duration::from_millis(ms.parse().expect("DURATION_MS")));
        let scheduler = Scheduler::builder().upstream(upstream).redis(env("REDIS_URL")).build().expect("scheduler");
        report_mode_changes(scheduler.clone());
        let handle = scheduler.upstream("mock").expect("configured");
        match env("MODE").as_str() {
            "hold" => {
                let hold: u32 = std::env::var("HOLD").ok().and_then(|h| h.parse().ok()).unwrap_or(limit);
                let mut permits = Vec::new();
                for _ in 0..hold {
                    permits.push(handle.request().acquire().await.expect("permit"));
                }
                println!("HOLDING {}", permits.len());
                tokio::time::sleep(Duration::from_secs(60)).await;
            }
            _ => {
                let callers: usize = env("CALLERS").parse().expect("CALLERS");
                let calls: usize = env("CALLS").parse().expect("CALLS");
                // Each caller makes its share of the calls, or stops at `until`.
                let share = move |caller: usize| (calls / callers + usize::from(caller < calls % callers)) as u64;
                let go_on =
                    move |caller, made| made < share(caller) && until.is_none_or(|until| Instant::now() < until);
                let (ok, err, first_error) = call_while(&handle, mock, callers, go_on).await;
                println!("RESULT ok={ok} err={err} first_error={first_error:?}");
            }
        }
    });
}

/// Prints `MODE <mode>` at every change of the scheduler's mode.
fn report_mode_changes(scheduler: Scheduler) {
    actix::spawn(async move {
        let mut last = None;
        loop {
            let Ok(mode) = scheduler.mode().await else { return };
            if last != Some(mode) {
                println!("MODE {mode}");
                last = Some(mode);
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    });
}
