//! The engine on tokio's paused time: the documented defaults (a 600 s call timeout, a 25 s
//! wait, 5 s cooldowns, a 15 min quota pause, a per-minute budget) checked at their real size,
//! in milliseconds of test time.
//!
//! The engine reads one clock, tokio's (`src/engine/clock.rs`): under `#[actix::test]` the
//! scheduler's actors run on the test's current-thread runtime, and `tokio::time::pause()`
//! makes every wait, timer and deadline of the engine jump ahead when all are idle. Each test
//! asserts the elapsed time on that clock to the millisecond band its rule promises.

use std::future::pending;
use std::time::{Duration, SystemTime};

use tokio::time::Instant;
use wavegate::config::Recovery;
use wavegate::{Outcome, Scheduler, UpstreamConfig};

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// A local scheduler with one upstream (its name is the test's, so no two tests share a gate).
fn scheduler(config: UpstreamConfig) -> Scheduler {
    Scheduler::builder().upstream(config).build().expect("scheduler")
}

/// Asserts that `elapsed` is within `[at, at + slack]`.
fn around(elapsed: Duration, at: Duration, slack: Duration) {
    assert!(elapsed >= at && elapsed <= at + slack, "after {elapsed:?}, expected {at:?} (+{slack:?})");
}

#[actix::test]
async fn a_call_cancelled_at_the_provider_holds_its_permit_for_the_default_call_timeout() {
    tokio::time::pause();
    let name = "cancelled-default-hold";
    let s = scheduler(UpstreamConfig::builder(name).limit(1).max_wait(secs(3_600)).build().expect("config"));
    let upstream = s.upstream(name).expect("configured");
    assert_eq!(upstream.config().cancelled_call_hold(), secs(600), "the default hold is the call timeout");
    let call = upstream.request().call(|_| pending::<Result<(), Outcome>>());
    let sent = Instant::now();
    assert!(tokio::time::timeout(ms(10), call).await.is_err(), "cancelled while at the provider");
    let permit = upstream.request().acquire().await.expect("the permit comes back after the hold");
    around(sent.elapsed(), secs(600), secs(1));
    permit.succeeded();
}

#[actix::test]
async fn a_waiter_gives_up_after_the_default_max_wait() {
    tokio::time::pause();
    let name = "default-max-wait";
    let s = scheduler(UpstreamConfig::builder(name).limit(1).build().expect("config"));
    let upstream = s.upstream(name).expect("configured");
    let held = upstream.request().acquire().await.expect("the only permit");
    let start = Instant::now();
    let refused = upstream.request().acquire().await.expect_err("nobody releases");
    assert_eq!(refused.code(), "waited_too_long");
    around(start.elapsed(), secs(25), ms(5));
    held.succeeded();
}

#[actix::test]
async fn a_429_cools_the_upstream_down_for_the_steps_of_the_ladder() {
    tokio::time::pause();
    let name = "default-cooldown";
    let config = UpstreamConfig::builder(name).limit(4).max_wait(secs(60)).recovery(Recovery::Seed);
    let s = scheduler(config.build().expect("config"));
    let upstream = s.upstream(name).expect("configured");
    // The seed's rule: a 429 stops everyone for the ladder's step (5 s, then 10 s while the
    // upstream has not recovered); the loop adds at most 50 ms of jitter.
    for step in [secs(5), secs(10)] {
        let permit = upstream.request().acquire().await.expect("a permit");
        permit.report(Outcome::from_status(429, None, SystemTime::now()));
        let start = Instant::now();
        let permit = upstream.request().acquire().await.expect("a permit after the cooldown");
        around(start.elapsed(), step, ms(60));
        drop(permit);
    }
}

#[actix::test]
async fn a_requests_budget_paces_the_calls_after_its_burst() {
    tokio::time::pause();
    let name = "paced-budget";
    let config = UpstreamConfig::builder(name).limit(10).requests_per_minute(60, 2).max_wait(secs(60));
    let s = scheduler(config.build().expect("config"));
    let upstream = s.upstream(name).expect("configured");
    let start = Instant::now();
    for _ in 0..5 {
        upstream.request().acquire().await.expect("a permit").succeeded();
    }
    // A burst of 2 at once, then one a second (plus at most 5 ms of jitter each).
    around(start.elapsed(), secs(3), ms(20));
}

#[actix::test]
async fn a_spent_quota_refuses_for_the_default_pause_then_lets_calls_through() {
    tokio::time::pause();
    let name = "spent-quota";
    let s = scheduler(UpstreamConfig::builder(name).limit(2).build().expect("config"));
    let upstream = s.upstream(name).expect("configured");
    let permit = upstream.request().acquire().await.expect("a permit");
    permit.report(Outcome::from_status(429, None, SystemTime::now()).with_error_code("insufficient_quota"));
    let refused = upstream.request().acquire().await.expect_err("the quota is spent");
    assert_eq!(refused.code(), "quota_exhausted");
    tokio::time::sleep(secs(15 * 60) - secs(1)).await;
    assert_eq!(upstream.request().acquire().await.expect_err("still spent").code(), "quota_exhausted");
    tokio::time::sleep(secs(2)).await;
    upstream.request().acquire().await.expect("the pause is over").succeeded();
}
