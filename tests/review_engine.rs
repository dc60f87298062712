//! The adversarial review of the issue-20 engine (lanes, gates, coordinator, grants): each test
//! reproduced one finding on the engine as first merged (d474373) and passes on the previous
//! engine (fc011bf) and on the fixed one. Real `redis-server`s from `wavegate-testkit` on free
//! ports; the mock provider counts what the provider sees. The two stress tests (callers
//! cancelled at random while Redis hangs) passed before and after.

use std::time::{Duration, SystemTime};

use wavegate::config::{BreakerConfig, Recovery};
use wavegate::{ErrorKind, Mode, Outcome, Scheduler, StoreConfig, UpstreamConfig, WaveState};
use wavegate_testkit::RedisServer;

mod common;
use common::wait_for_mode;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// F1. A half-open probe admitted into the queue whose caller goes away while it waits: its
/// breaker ticket must come back ("ignored"), as the old engine's `Admission` guard gave it
/// back on drop. The lane drops such waiters in `Waiters::retain_live` (src/engine/lane/
/// waiters.rs:82) together with their ticket, so the probe slot stays taken and the breaker
/// refuses every call (`BreakerOpen`) until `probe_timeout` (60 s by default) has passed.
#[tokio::test]
async fn a_half_open_probe_whose_caller_left_the_queue_gives_its_slot_back() {
    let breaker = BreakerConfig {
        failure_rate: 0.5,
        minimum_calls: 1,
        open_for: ms(200),
        half_open_probes: 2,
        ..BreakerConfig::default()
    };
    let config = UpstreamConfig::builder("llm").limit(2).max_wait(ms(5_000)).breaker(breaker).build().expect("config");
    let scheduler = common::isolated().upstream(config).build().expect("scheduler");
    let llm = scheduler.upstream("llm").expect("configured");

    let held = llm.request().acquire().await.expect("a permit while closed");
    let failing = llm.request().acquire().await.expect("a permit while closed");
    failing.report(Outcome::from_status(500, None, SystemTime::now())); // opens the breaker
    assert_eq!(llm.status().await.expect("status").breaker, "open");
    tokio::time::sleep(ms(300)).await; // open_for passes: the next admission is a probe

    let first_probe = llm.request().acquire().await.expect("the first probe takes the free slot");
    // The second probe waits in the queue (the limit is full) and its caller gives up.
    let gave_up = tokio::time::timeout(ms(100), llm.request().acquire()).await;
    assert!(gave_up.is_err(), "the second probe should have waited: {gave_up:?}");
    first_probe.succeeded(); // one probe of two succeeded: still half-open

    // The caller that gave up never made a call: its slot is free for the next caller.
    let next = tokio::time::timeout(ms(2_000), llm.request().acquire()).await.expect("answered in time");
    match next {
        Ok(permit) => permit.succeeded(),
        Err(error) => panic!("the probe slot of a caller that left the queue was never given back: {error:?}"),
    }
    held.succeeded();
}

/// The tokens left in the shared budget of `upstream`, as the store says (shared mode).
async fn shared_tokens_left(scheduler: &Scheduler) -> u64 {
    let status = scheduler.upstream("llm").expect("configured").status().await.expect("status");
    assert_eq!(status.mode, Mode::Shared);
    status.budgets.tokens.expect("a tokens budget").0
}

/// F2. A release sent to the store in shared mode whose (successful) reply comes back after
/// another command's timeout has switched the lane to fallback: the store has settled it, but
/// `on_released` (src/engine/lane/release.rs:129) sees `mode == Fallback` and adds its token
/// delta to the outage's usage, which the reconciliation charges to the shared budget again.
/// (The old engine kept a shared reply out of the outage's books.)
#[tokio::test]
async fn a_shared_release_answered_after_the_switch_is_not_charged_twice() {
    let mut redis = RedisServer::start().expect("redis-server");
    // 600 tokens a minute (10 a second) and a 10 000 burst: what was charged stays visible.
    let config = UpstreamConfig::builder("llm")
        .limit(4)
        .tokens_per_minute(600, 10_000)
        .max_wait(ms(5_000))
        .build()
        .expect("config");
    let store = StoreConfig { command_timeout: ms(1_000), ..StoreConfig::new(redis.url()) };
    let scheduler = Scheduler::builder().upstream(config).store(store).build().expect("scheduler");
    let llm = scheduler.upstream("llm").expect("configured");
    let permit = llm.request().tokens(1_000).acquire().await.expect("a permit while healthy");
    tokio::time::sleep(ms(100)).await;
    let before = shared_tokens_left(&scheduler).await;
    assert!((8_900..=9_100).contains(&before), "1 000 reserved of 10 000: {before}");

    redis.pause().expect("SIGSTOP");
    // An acquire goes out first: its timeout (1 s) is the one that switches to fallback.
    let waiter = {
        let llm = llm.clone();
        tokio::spawn(async move { llm.request().acquire().await.map(|permit| permit.succeeded()) })
    };
    tokio::time::sleep(ms(400)).await;
    // The release goes out 400 ms later: 4 000 tokens used beyond the reservation.
    permit.report_usage(Outcome::success(200), 5_000);
    wait_for_mode(&scheduler, Mode::Fallback, Duration::from_secs(3)).await;
    // The store answers the release before its own timeout: it settles the 4 000 there.
    redis.resume().expect("SIGCONT");
    waiter.await.expect("task").expect("a permit through the fallback");
    wait_for_mode(&scheduler, Mode::Shared, Duration::from_secs(5)).await;
    tokio::time::sleep(ms(100)).await;

    // 1 000 reserved + 4 000 settled: about 5 000 left (plus what refilled, ~50 tokens).
    let after = shared_tokens_left(&scheduler).await;
    assert!(
        after >= 4_500,
        "the settlement of the release answered after the switch was charged twice: {after} tokens left (expected ~5 000)"
    );
}

/// F3. Admission order: the old engine asked the breaker (and the retry budget) before the
/// queue (`git show fc011bf:src/request.rs`, `acquire_permit`: quota, then `Admit` at the
/// supervisor, then the coordinator's queue), so while the breaker is open every caller was
/// told `BreakerOpen` with its `Retry-After`. The lane checks a full queue first
/// (src/engine/lane/admission.rs:79, before the retry budget at :86 and the breaker at :95):
/// the same caller now gets `QueueFull`, which carries no `retry_after`.
#[tokio::test]
async fn an_open_breaker_is_told_before_a_full_queue() {
    let breaker = BreakerConfig { minimum_calls: 1, open_for: ms(10_000), ..BreakerConfig::default() };
    let config = UpstreamConfig::builder("llm")
        .limit(2)
        .queue_capacity(1)
        .recovery(Recovery::Seed)
        .max_wait(ms(5_000))
        .breaker(breaker)
        .build()
        .expect("config");
    let scheduler = common::isolated().upstream(config).build().expect("scheduler");
    let llm = scheduler.upstream("llm").expect("configured");
    let rate_limited = llm.request().acquire().await.expect("permit");
    let failing = llm.request().acquire().await.expect("permit");
    rate_limited.report(Outcome::from_status(429, Some("5"), SystemTime::now())); // a 5 s cooldown
    let queued = {
        let llm = llm.clone();
        tokio::spawn(async move { llm.request().acquire().await.map(|permit| permit.succeeded()) })
    };
    tokio::time::sleep(ms(100)).await;
    assert_eq!(llm.status().await.expect("status").queue_depth, 1, "the queue is full");
    failing.report(Outcome::from_status(500, None, SystemTime::now())); // opens the breaker
    assert_eq!(llm.status().await.expect("status").breaker, "open");

    let error = llm.request().acquire().await.expect_err("refused");
    assert!(
        error.kind() == ErrorKind::BreakerOpen && error.retry_after().is_some(),
        "an open breaker should be told first, with its Retry-After: {error:?}"
    );
    queued.abort();
}

/// F2, its 429 side: the same stale reply carries the store's answer to a 429 (it cut the shared
/// wave). `on_released` records that cut as a 429 "seen during the outage" (release.rs:129-135),
/// and the reconciliation reports it to the shared wave again (outage.rs:113-119, `carry` with
/// `always`, when the fallback carried on a PROBE or DEGRADED state): one 429, two cuts.
#[tokio::test]
async fn a_429_answered_by_the_store_after_the_switch_cuts_the_shared_wave_once() {
    let mut redis = RedisServer::start().expect("redis-server");
    let config = UpstreamConfig::builder("llm")
        .limit(4)
        .recovery(Recovery::Seed)
        .cooldown_ladder([ms(1)])
        .min_cooldown(ms(1))
        .max_wait(ms(5_000))
        .build()
        .expect("config");
    let store = StoreConfig { command_timeout: ms(1_000), ..StoreConfig::new(redis.url()) };
    let scheduler = Scheduler::builder().upstream(config).store(store).build().expect("scheduler");
    let llm = scheduler.upstream("llm").expect("configured");
    let first = llm.request().acquire().await.expect("permit");
    first.report(Outcome::rate_limited(None)); // wave 1 -> 2, a 1 ms cooldown, then PROBE
    tokio::time::sleep(ms(50)).await;
    let permit = llm.request().acquire().await.expect("the PROBE permit");
    assert_eq!((permit.state(), permit.wave()), (WaveState::Probe, 2));

    redis.pause().expect("SIGSTOP");
    let waiter = {
        let llm = llm.clone();
        tokio::spawn(async move { llm.request().acquire().await.map(|permit| permit.succeeded()) })
    };
    tokio::time::sleep(ms(400)).await;
    permit.report(Outcome::rate_limited(None)); // reaches the store late: wave 2 -> 3
    wait_for_mode(&scheduler, Mode::Fallback, Duration::from_secs(3)).await;
    redis.resume().expect("SIGCONT"); // the store answers the 429's release before its timeout
    waiter.await.expect("task").expect("a permit through the fallback (PROBE carried on)");
    wait_for_mode(&scheduler, Mode::Shared, Duration::from_secs(5)).await;
    tokio::time::sleep(ms(100)).await;
    let status = llm.status().await.expect("status");
    assert_eq!(status.wave, 3, "one 429 cut the shared wave twice: {status:?}");
}

/// The permits in the shared set of upstream `llm` (default key prefix).
fn shared_members(redis: &RedisServer) -> Vec<String> {
    let mut con = redis.connection().expect("direct connection");
    redis::cmd("ZRANGE").arg("wavegate:{llm}:permits").arg(0).arg(-1).query(&mut con).expect("ZRANGE")
}

/// Stress: callers cancelled at random points (waiting, at the provider: held for the hold)
/// while Redis hangs and comes back several times (its buffered commands run late). The mock
/// provider referees: never more than the limit at once; and once the holds are over, no
/// permit is left, here or in the store (a fixed 60 s lease: a leak would still be there).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancellations_across_hangs_of_redis_leave_nothing_behind() {
    cancellations_across_hangs_of_redis(false).await;
}

/// The same stress with two priority classes and three tenants (the gates choose among heads).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancellations_across_hangs_of_redis_leave_nothing_behind_with_classes_and_tenants() {
    cancellations_across_hangs_of_redis(true).await;
}

async fn cancellations_across_hangs_of_redis(classes: bool) {
    use rand::rngs::SmallRng;
    use rand::{Rng, SeedableRng};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
    use wavegate_testkit::{MockUpstream, MockUpstreamConfig};

    let seed = common::seed("WAVEGATE_REVIEW_SEED");
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut redis = RedisServer::start().expect("redis-server");
    let mock = MockUpstream::start(MockUpstreamConfig { service_time: ms(150), ..MockUpstreamConfig::default() })
        .expect("mock provider");
    let limit = 4;
    let config = UpstreamConfig::builder("llm")
        .limit(limit as u32)
        .permit_ttl(Duration::from_secs(60))
        .call_timeout(ms(1_000))
        .cancelled_call_hold(ms(300))
        .max_wait(ms(3_000));
    let config =
        if classes { config.class("interactive", 3).class("batch", 1).reserve("interactive", 25) } else { config };
    let config = config.build().expect("config");
    let scheduler = Scheduler::builder().upstream(config).redis(redis.url()).build().expect("scheduler");
    let llm = scheduler.upstream("llm").expect("configured");
    let addr = mock.addr();
    let cancelled = Arc::new(AtomicUsize::new(0));
    let hangs: Vec<(u64, u64)> = (0..3).map(|_| (rng.random_range(200..=800), rng.random_range(100..=600))).collect();
    let calls = (0..120).map(|_| {
        let (llm, cancelled) = (llm.clone(), cancelled.clone());
        let patience = ms(rng.random_range(0..=400));
        let class = if rng.random_bool(0.5) { "interactive" } else { "batch" };
        let tenant = ["a", "b", "c"][rng.random_range(0..3)];
        let start_after = ms(rng.random_range(0..=3_000));
        async move {
            tokio::time::sleep(start_after).await;
            let request = if classes { llm.request().priority(class).tenant(tenant) } else { llm.request() };
            if common::call_given_up(request, addr, patience).await {
                cancelled.fetch_add(1, SeqCst);
            }
        }
    });
    let nemesis = async {
        for (before, hang) in hangs {
            tokio::time::sleep(ms(before)).await;
            redis.pause().expect("SIGSTOP");
            tokio::time::sleep(ms(hang)).await;
            redis.resume().expect("SIGCONT");
        }
    };
    tokio::join!(futures_util::future::join_all(calls), nemesis);
    println!(
        "seed {seed}: {} served, {} cancelled, at most {} at the provider at once",
        mock.served(),
        cancelled.load(SeqCst),
        mock.max_in_flight()
    );
    assert!(mock.max_in_flight() <= limit, "seed {seed}: the provider saw {} at once", mock.max_in_flight());
    wait_for_mode(&scheduler, Mode::Shared, Duration::from_secs(5)).await;
    // The holds (300 ms) and the provider (150 ms) are over; give the releases a moment.
    tokio::time::sleep(ms(1_000)).await;
    let status = llm.status().await.expect("status");
    assert_eq!(status.in_flight_local, 0, "seed {seed}: permits left held here: {status:?}");
    assert_eq!(shared_members(&redis), Vec::<String>::new(), "seed {seed}: registrations left in the store");
}
