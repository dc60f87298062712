//! Callers cancelled at any point: no permit is ever lost, and the provider never sees more
//! calls at once than the limit.
//!
//! A caller can be dropped while it waits, after its grant was sent but before it polled it
//! again, before its request left, or while its request is at the provider. The first three
//! must give the permit back at once; the last must keep it until the provider has plausibly
//! finished (`cancelled_call_hold`), because the provider goes on serving the request. Each
//! test draws where callers give up from a seed it prints (`WAVEGATE_CANCEL_SEED=<seed>`
//! replays it), and checks from the mock provider's own counts.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::time::{Duration, Instant};

use futures_util::future::join_all;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use wavegate::{Scheduler, Upstream, UpstreamConfig};
use wavegate_testkit::{MockUpstream, MockUpstreamConfig};

mod common;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// Callers that give up after 0–10 ms behind a `biased` select (the timer wins when both are
/// ready, so some are dropped with their grant already sent): `rounds` rounds of `callers`.
async fn give_up_at_random(upstream: &Upstream, rng: &mut SmallRng, rounds: usize, callers: usize) -> usize {
    let mut granted = 0;
    for _ in 0..rounds {
        let tries = (0..callers).map(|_| {
            let upstream = upstream.clone();
            let patience = ms(rng.random_range(0..=10));
            let hold = ms(rng.random_range(0..=3));
            async move {
                tokio::select! {
                    biased;
                    _ = tokio::time::sleep(patience) => 0,
                    permit = upstream.request().acquire() => match permit {
                        Ok(permit) => {
                            tokio::time::sleep(hold).await;
                            drop(permit);
                            1
                        }
                        Err(_) => 0,
                    },
                }
            }
        });
        granted += join_all(tries).await.into_iter().sum::<usize>();
    }
    granted
}

/// After the storm, every permit can be had again, all at once, and none is held.
async fn all_permits_come_back(upstream: &Upstream, limit: usize) {
    let status = upstream.status().await.expect("status");
    assert_eq!(status.in_flight_local, 0, "permits left held: {status:?}");
    let permits = join_all((0..limit).map(|_| upstream.request().timeout(ms(2_000)).acquire())).await;
    let held: Vec<_> = permits.into_iter().map(|p| p.expect("every permit comes back")).collect();
    assert_eq!(held.len(), limit);
    assert_eq!(upstream.status().await.expect("status").in_flight_local, limit);
    for permit in held {
        permit.succeeded();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn callers_dropped_at_random_points_leave_no_permit_behind() {
    let seed = common::seed("WAVEGATE_CANCEL_SEED");
    let mut rng = SmallRng::seed_from_u64(seed);
    let limit = 4;
    let config = UpstreamConfig::builder("dropped").limit(limit as u32).max_wait(ms(50)).build().expect("config");
    let scheduler = Scheduler::builder().upstream(config).build().expect("scheduler");
    let upstream = scheduler.upstream("dropped").expect("configured");
    let granted = give_up_at_random(&upstream, &mut rng, 30, 12).await;
    assert!(granted > 0, "seed {seed}: nobody was ever granted");
    all_permits_come_back(&upstream, limit).await;
}

#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn callers_dropped_at_random_points_leave_no_permit_behind_in_redis() {
    let seed = common::seed("WAVEGATE_CANCEL_SEED");
    let mut rng = SmallRng::seed_from_u64(seed);
    let redis = wavegate_testkit::RedisServer::start().expect("redis-server");
    let limit = 4;
    let config = UpstreamConfig::builder("dropped").limit(limit as u32).max_wait(ms(80)).build().expect("config");
    let scheduler = Scheduler::builder().upstream(config).redis(redis.url()).build().expect("scheduler");
    let upstream = scheduler.upstream("dropped").expect("configured");
    let granted = give_up_at_random(&upstream, &mut rng, 15, 12).await;
    assert!(granted > 0, "seed {seed}: nobody was ever granted");
    // The store agrees: no registration outlives its caller.
    let deadline = Instant::now() + ms(2_000);
    loop {
        let status = upstream.status().await.expect("status");
        if status.in_flight_fleet == Some(0) && status.in_flight_local == 0 {
            break;
        }
        assert!(Instant::now() < deadline, "seed {seed}: permits left in Redis: {status:?}");
        tokio::time::sleep(ms(20)).await;
    }
    all_permits_come_back(&upstream, limit).await;
}

/// Calls to a real mock provider, each cancelled at a random point (waiting, about to send,
/// at the provider) by a caller's timeout, as an axum handler is when its client hangs up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_calls_never_let_the_provider_see_more_than_the_limit() {
    let seed = common::seed("WAVEGATE_CANCEL_SEED");
    let mut rng = SmallRng::seed_from_u64(seed);
    let service = ms(150);
    let mock = MockUpstream::start(MockUpstreamConfig { service_time: service, ..MockUpstreamConfig::default() })
        .expect("mock provider");
    let limit = 4;
    // The provider takes 150 ms; the hold is what it plausibly needs at most.
    let config = UpstreamConfig::builder("provider")
        .limit(limit as u32)
        .call_timeout(ms(1_000))
        .cancelled_call_hold(ms(300))
        .max_wait(ms(3_000))
        .build()
        .expect("config");
    let scheduler = Scheduler::builder().upstream(config).build().expect("scheduler");
    let upstream = scheduler.upstream("provider").expect("configured");
    let addr = mock.addr();
    let cancelled = Arc::new(AtomicUsize::new(0));
    let calls = (0..60).map(|_| {
        let (upstream, cancelled) = (upstream.clone(), cancelled.clone());
        let patience = ms(rng.random_range(0..=400));
        let start_after = ms(rng.random_range(0..=600));
        async move {
            tokio::time::sleep(start_after).await;
            if common::call_given_up(upstream.request(), addr, patience).await {
                cancelled.fetch_add(1, SeqCst);
            }
        }
    });
    // Watch while they run: the provider never serves more than the permits held.
    let watch = async {
        let mut worst = 0;
        let until = Instant::now() + ms(1_200);
        while Instant::now() < until {
            let held = upstream.status().await.expect("status").in_flight_local;
            let serving = mock.in_flight();
            worst = worst.max(serving.saturating_sub(held));
            tokio::time::sleep(ms(5)).await;
        }
        worst
    };
    let (_, over) = tokio::join!(join_all(calls), watch);
    let cancelled = cancelled.load(SeqCst);
    println!(
        "seed {seed}: {} served, {cancelled} cancelled, at most {} at the provider at once",
        mock.served(),
        mock.max_in_flight()
    );
    assert!(cancelled > 0, "seed {seed}: nothing was cancelled; the test proves nothing");
    assert!(mock.max_in_flight() <= limit, "seed {seed}: the provider saw {} at once", mock.max_in_flight());
    // Sampled apart, so a call that just ended can read as one more serving than held.
    assert!(over <= 1, "seed {seed}: the provider served {over} more than the permits held");
    // Once the provider is done and the holds are over, nothing is held.
    tokio::time::sleep(ms(400)).await;
    assert_eq!(mock.in_flight(), 0);
    all_permits_come_back(&upstream, limit).await;
}
