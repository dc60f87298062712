//! A token estimate that can never fit is refused before any wait: not queued behind other
//! callers, not held at the limit or in a cooldown; in fallback too, against the fleet's
//! burst (one above this process's share of it is admitted in debt, see tests/outage.rs).

use std::time::{Duration, Instant};

use wavegate::{ErrorKind, UpstreamConfig};

mod common;

fn config(limit: u32) -> UpstreamConfig {
    UpstreamConfig::builder("llm")
        .limit(limit)
        .tokens_per_minute(60_000, 1_000)
        .max_wait(Duration::from_secs(5))
        .build()
        .expect("valid config")
}

#[tokio::test]
async fn an_estimate_above_the_burst_is_refused_at_once_behind_a_full_limit_and_a_queue() {
    let scheduler = common::isolated().upstream(config(1)).build().expect("scheduler");
    let llm = scheduler.upstream("llm").expect("configured");
    let held = llm.request().acquire().await.expect("the only permit");
    // Someone waits at the head of the queue.
    let waiter = {
        let llm = llm.clone();
        tokio::spawn(async move { llm.request().tokens(10).acquire().await.map(|p| p.succeeded()) })
    };
    let start = Instant::now();
    while llm.status().await.expect("status").queue_depth < 1 {
        assert!(start.elapsed() < Duration::from_secs(1), "the waiter never queued");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let start = Instant::now();
    let error = llm.request().tokens(1_001).acquire().await.expect_err("never fits");
    let error_call = llm.request().tokens(1_001).call(|_| async { Ok::<_, wavegate::Outcome>(()) }).await;
    let took = start.elapsed();
    assert!(took < Duration::from_millis(100), "refused after {took:?}: it waited");
    assert_eq!(
        (error.kind(), error.requested(), error.burst()),
        (ErrorKind::InsufficientCapacity, Some(1_001), Some(1_000)),
        "{error:?}"
    );
    let error_call = error_call.expect_err("never fits either");
    assert_eq!(error_call.kind(), ErrorKind::InsufficientCapacity, "{error_call:?}");
    assert_eq!(llm.status().await.expect("status").queue_depth, 1, "the queued waiter was disturbed");
    held.succeeded();
    waiter.await.expect("task").expect("the waiter is served");
}

#[cfg(feature = "redis")]
#[tokio::test]
async fn in_fallback_an_estimate_above_the_share_is_admitted_and_one_above_the_fleets_burst_refused() {
    use wavegate::{Budget, Mode, Scheduler};
    use wavegate_testkit::RedisServer;
    let mut redis = RedisServer::start().expect("redis-server");
    let build = || Scheduler::builder().upstream(config(4)).redis(redis.url()).build().expect("scheduler");
    let (a, _b) = (build(), build());
    let llm = a.upstream("llm").expect("configured");
    llm.request().acquire().await.expect("a permit while healthy").succeeded();
    // Heartbeats (every second) after both started: each counts two live processes. Two of
    // them, so a slow machine still has one.
    tokio::time::sleep(Duration::from_millis(2_200)).await;
    redis.kill().expect("kill -9");
    llm.request().acquire().await.expect("a permit through the fallback").succeeded();
    assert_eq!(a.mode().await.expect("mode"), Mode::Fallback);
    assert_eq!(llm.status().await.expect("status").limit, 2, "a fair share of 4 for 2 live processes");

    // 600 > the share's burst of 500 (30,000 a minute): admitted at once, its bucket full,
    // into debt (1.2 s at the share's rate).
    let start = Instant::now();
    llm.request().tokens(600).acquire().await.expect("600 is admitted in debt").succeeded();
    assert!(start.elapsed() < Duration::from_millis(100), "admitted after {:?}", start.elapsed());
    // Above the shared burst: never fits, in any mode.
    let error = llm.request().tokens(1_001).acquire().await.expect_err("never fits");
    assert_eq!(
        (error.kind(), error.requested(), error.burst(), error.budget()),
        (ErrorKind::InsufficientCapacity, Some(1_001), Some(1_000), Some(Budget::TokensPerMinute)),
        "{error:?}"
    );
    assert!(!error.is_retryable(), "{error}");
}
