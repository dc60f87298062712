//! Shared mode through the public API: two schedulers (two coordinators, as two processes
//! would have) on one real redis-server share one limit and one 429 wave.

use std::time::{Duration, Instant, SystemTime};

use wavegate::{Mode, Outcome, Scheduler, UpstreamConfig, WaveState};
use wavegate_testkit::RedisServer;

fn upstream(limit: u32) -> UpstreamConfig {
    UpstreamConfig::builder("llm")
        .limit(limit)
        .recovery(wavegate::config::Recovery::Seed) // the walk-through below is the seed's
        .cooldown_ladder([Duration::from_millis(300), Duration::from_millis(600)])
        .min_cooldown(Duration::from_millis(50))
        .max_wait(Duration::from_secs(5))
        .build()
        .expect("valid config")
}

fn fleet(redis: &RedisServer, limit: u32) -> (Scheduler, Scheduler) {
    let build = || Scheduler::builder().upstream(upstream(limit)).redis(redis.url()).build().expect("scheduler");
    (build(), build())
}

fn rate_limited() -> Outcome {
    Outcome::from_status(429, None, SystemTime::now())
}

async fn expect_state(scheduler: &Scheduler, state: WaveState, limit: u32, wave: u64) {
    let llm = scheduler.upstream("llm").expect("configured");
    let status = llm.status().await.expect("status");
    assert_eq!((status.state, status.limit, status.wave), (state, limit, wave), "{status:?}");
    assert_eq!(status.mode, Mode::Shared);
}

#[actix::test]
async fn fifty_simultaneous_429s_from_two_processes_cut_once() {
    let redis = RedisServer::start().expect("redis-server");
    let (a, b) = fleet(&redis, 50);
    let llm_b = b.upstream("llm").expect("configured");
    let llm_a = a.upstream("llm").expect("configured");
    let mut permits = Vec::new();
    for i in 0..50 {
        let scheduler = if i % 2 == 0 { &a } else { &b };
        permits.push(scheduler.upstream("llm").expect("configured").request().acquire().await.expect("permit"));
    }
    assert!(permits.iter().all(|p| p.wave() == 1));
    expect_state(&a, WaveState::Normal, 50, 1).await;
    for permit in permits {
        permit.report(rate_limited());
    }
    // Let the reports land.
    let deadline = Instant::now() + Duration::from_secs(2);
    while llm_a.status().await.expect("status").in_flight_fleet != Some(0) {
        assert!(Instant::now() < deadline, "the 50 reports did not land");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    expect_state(&b, WaveState::Cooldown, 25, 2).await;
    // No permit during COOLDOWN, from either process.
    let started = Instant::now();
    let permit = llm_b.request().acquire().await.expect("a permit after the cooldown");
    assert!(started.elapsed() >= Duration::from_millis(250), "granted during COOLDOWN after {:?}", started.elapsed());
    assert_eq!((permit.state(), permit.limit(), permit.wave()), (WaveState::Probe, 1, 2));
}

#[actix::test]
async fn the_seed_walk_through_across_two_processes() {
    let redis = RedisServer::start().expect("redis-server");
    let (a, b) = fleet(&redis, 10);
    let llm_b = b.upstream("llm").expect("configured");
    let llm_a = a.upstream("llm").expect("configured");
    // 1. A and B get permits in wave 1.
    let first = llm_a.request().acquire().await.expect("A");
    let second = llm_b.request().acquire().await.expect("B");
    assert_eq!((first.wave(), second.wave()), (1, 1));
    // 2. A gets 429: 10 → 5, wave 2, COOLDOWN.
    first.report(rate_limited());
    tokio::time::sleep(Duration::from_millis(30)).await;
    expect_state(&b, WaveState::Cooldown, 5, 2).await;
    // 3. B's late 429 (wave 1) cuts nothing.
    second.report(rate_limited());
    tokio::time::sleep(Duration::from_millis(30)).await;
    expect_state(&a, WaveState::Cooldown, 5, 2).await;
    // 4. After the cooldown: PROBE at 1; three successes → DEGRADED 2 → 4 → 8 → NORMAL 10.
    let probe = llm_b.request().acquire().await.expect("probe permit");
    assert_eq!((probe.state(), probe.limit()), (WaveState::Probe, 1));
    probe.succeeded();
    for _ in 0..2 {
        llm_a.request().acquire().await.expect("probe permit").succeeded();
    }
    tokio::time::sleep(Duration::from_millis(30)).await;
    expect_state(&a, WaveState::Degraded, 2, 2).await;
    for (limit, next) in [(2, 4), (4, 8), (8, 10)] {
        let mut held = Vec::new();
        for i in 0..limit {
            let scheduler = if i % 2 == 0 { &a } else { &b };
            held.push(scheduler.upstream("llm").expect("configured").request().acquire().await.expect("permit"));
        }
        assert!(held.iter().all(|p| p.limit() == limit && p.state() == WaveState::Degraded));
        for permit in held {
            permit.succeeded();
        }
        tokio::time::sleep(Duration::from_millis(30)).await;
        let state = if next == 10 { WaveState::Normal } else { WaveState::Degraded };
        expect_state(&b, state, next, 2).await;
    }
}

#[actix::test]
async fn a_retry_after_a_429_waits_for_the_shared_cooldown() {
    let redis = RedisServer::start().expect("redis-server");
    let (a, b) = fleet(&redis, 4);
    let llm_b = b.upstream("llm").expect("configured");
    let llm_a = a.upstream("llm").expect("configured");
    let started = Instant::now();
    let attempts = std::rc::Rc::new(std::cell::Cell::new(0u32));
    let counter = attempts.clone();
    let result = llm_a
        .request()
        .call(move |attempt| {
            counter.set(attempt.number);
            async move {
                if attempt.number == 1 {
                    Err(Outcome::from_status(429, Some("0.4"), SystemTime::now()))
                } else {
                    Ok(started.elapsed())
                }
            }
        })
        .await;
    let second_attempt_at = result.expect("the retry succeeds");
    assert_eq!(attempts.get(), 2);
    assert!(second_attempt_at >= Duration::from_millis(400), "retried after {second_attempt_at:?}, before Retry-After");
    // The other process saw the same wave.
    let status = llm_b.status().await.expect("status");
    assert_eq!(status.wave, 2);
    let unknown = a.upstream("nope").expect_err("not configured");
    assert_eq!(unknown.name, "nope");
}

/// A short-lived process (a script, a CLI, a batch job) that exits right after its last call:
/// the release of its permit reaches Redis before the actors' thread stops, so the permit
/// does not hold a slot of the fleet's limit for a whole lease. Ten such "processes" in a row
/// against a limit of 1.
#[test]
fn a_scheduler_dropped_right_after_its_last_call_leaves_no_permit_behind() {
    let redis = RedisServer::start().expect("redis-server");
    let mut con = redis.connection().expect("connection");
    for run in 0..10 {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        runtime.block_on(async {
            let scheduler = Scheduler::builder().upstream(upstream(1)).redis(redis.url()).build().expect("scheduler");
            let started = Instant::now();
            let permit = scheduler
                .upstream("llm")
                .expect("configured")
                .request()
                .acquire()
                .await
                .expect("the only permit is free");
            assert!(started.elapsed() < Duration::from_secs(2), "run {run}: waited {:?}", started.elapsed());
            permit.succeeded();
            // The scheduler goes out of scope here, as at a process's exit.
        });
        drop(runtime);
        let held: u64 = redis::cmd("ZCARD").arg("wavegate:{llm}:permits").query(&mut con).expect("ZCARD");
        assert_eq!(held, 0, "run {run}: the exiting scheduler left its permit in Redis");
    }
}

/// A release in one process wakes the waiter of another at once (not at its next poll, 250 to
/// 500 ms later), through that process's own wake-up channel: each process subscribes to one
/// channel whatever its number of upstreams, and a release is delivered to one process.
#[actix::test]
async fn a_release_wakes_another_process_at_once_on_its_own_channel() {
    let redis = RedisServer::start().expect("redis-server");
    let (a, b) = fleet(&redis, 1);
    let held = a.upstream("llm").expect("configured").request().acquire().await.expect("permit");
    let waiter = {
        let b = b.clone();
        actix::spawn(async move {
            let permit = b.upstream("llm").expect("configured").request().acquire().await.expect("the waiter's permit");
            (Instant::now(), permit)
        })
    };
    // Past the waiter's first polls, so only a wake-up serves it fast.
    tokio::time::sleep(Duration::from_millis(700)).await;
    let mut con = redis.connection().expect("connection");
    let channels: Vec<String> =
        redis::cmd("PUBSUB").arg("CHANNELS").arg("wavegate:*").query(&mut con).expect("PUBSUB CHANNELS");
    // One wake-up channel per process, and the fleet's one channel of live changes.
    let wakes = channels.iter().filter(|c| c.starts_with("wavegate:{wake:") && c.ends_with("}:released")).count();
    assert_eq!((channels.len(), wakes), (3, 2), "{channels:?}");
    assert!(channels.contains(&"wavegate:{live:changes}:released".to_string()), "{channels:?}");
    let released = Instant::now();
    held.succeeded();
    let (granted, permit) = waiter.await.expect("waiter");
    let took = granted.duration_since(released);
    assert!(took < Duration::from_millis(150), "the other process's waiter was served {took:?} after the release");
    permit.succeeded();
}

/// What an idle fleet asks of Redis does not grow with its size times its upstreams: each
/// process beats once a second, and only the fleet's gauge reader reads the budgets' gauges
/// (one status script per upstream per second), not every process.
#[actix::test]
async fn an_idle_fleet_reads_its_budget_gauges_once_not_once_per_process() {
    const PROCESSES: usize = 8;
    const UPSTREAMS: usize = 2;
    let redis = RedisServer::start().expect("redis-server");
    let fleet: Vec<Scheduler> = (0..PROCESSES)
        .map(|_| {
            let mut builder = Scheduler::builder();
            for u in 0..UPSTREAMS {
                let config = UpstreamConfig::builder(format!("llm{u}"))
                    .limit(4)
                    .requests_per_minute(600, 10)
                    .build()
                    .expect("config");
                builder = builder.upstream(config);
            }
            builder.redis(redis.url()).build().expect("scheduler")
        })
        .collect();
    let mut con = redis.connection().expect("connection");
    let scripts = |con: &mut redis::Connection| -> u64 {
        let info: String = redis::cmd("INFO").arg("commandstats").query(con).expect("INFO");
        info.lines()
            .find_map(|line| line.strip_prefix("cmdstat_evalsha:calls="))
            .and_then(|rest| rest.split(',').next())
            .map_or(0, |calls| calls.parse().expect("a count"))
    };
    tokio::time::sleep(Duration::from_millis(1_500)).await; // past the startup checks
    let before = scripts(&mut con);
    tokio::time::sleep(Duration::from_secs(4)).await;
    let per_second = (scripts(&mut con) - before) as f64 / 4.0;
    // Heartbeats: one per process per second; gauges: one per upstream per second; the live
    // settings' safety net: one per process and upstream every 60 s (10 s without a
    // subscription: counted so here). Read by every process,
    // the gauges (or the live settings) each second would be PROCESSES × UPSTREAMS = 16 more.
    let bound = (PROCESSES + UPSTREAMS) as f64 + (PROCESSES * UPSTREAMS) as f64 / 10.0 + 2.0;
    assert!(per_second <= bound, "{per_second} scripts a second from an idle fleet (at most {bound})");
    assert!(per_second >= PROCESSES as f64 - 1.0, "{per_second} scripts a second: the heartbeats are missing");
    drop(fleet);
}
