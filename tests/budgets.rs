//! Requests-per-minute and tokens-per-minute budgets through the public API: exact waits,
//! token reservations settled after the call, estimates too large to fit, and usage during a
//! Redis outage charged to the shared budget on recovery.

use std::time::{Duration, Instant};

use wavegate::{ErrorKind, Mode, Outcome, Scheduler, UpstreamConfig};
use wavegate_testkit::RedisServer;

mod common;

fn success() -> Outcome {
    Outcome::from_status(200, None, std::time::SystemTime::now())
}

fn tokens_upstream() -> UpstreamConfig {
    // One token a millisecond, at most 1,000 at once.
    UpstreamConfig::builder("llm").limit(10).tokens_per_minute(60_000, 1_000).build().expect("config")
}

async fn refunds_and_extra_charges(first: &Scheduler, second: &Scheduler) {
    let started = Instant::now();
    let reserved = first.upstream("llm").expect("configured").request().tokens(800).acquire().await.expect("800 fit");
    reserved.report_usage(success(), 300); // 500 come back
    tokio::time::sleep(Duration::from_millis(20)).await;
    let next = second
        .upstream("llm")
        .expect("configured")
        .request()
        .tokens(700)
        .acquire()
        .await
        .expect("700 fit after the refund");
    assert!(
        started.elapsed() < Duration::from_millis(250),
        "the refund must make room at once: {:?}",
        started.elapsed()
    );
    next.report_usage(success(), 1_200); // 500 more than reserved
    tokio::time::sleep(Duration::from_millis(20)).await;
    // 300 + 1,200 used: the budget is 500 in debt, so even 100 tokens wait about 600 ms.
    let waited = Instant::now();
    first
        .upstream("llm")
        .expect("configured")
        .request()
        .tokens(100)
        .acquire()
        .await
        .expect("100 fit later")
        .succeeded();
    let waited = waited.elapsed();
    assert!(waited >= Duration::from_millis(450), "the extra charge must delay the next caller: {waited:?}");
    assert!(waited < Duration::from_millis(1_500), "{waited:?}");
}

#[actix::test]
async fn token_reservations_are_settled_in_local_mode() {
    let scheduler = common::isolated().upstream(tokens_upstream()).build().expect("scheduler");
    refunds_and_extra_charges(&scheduler, &scheduler).await;
}

#[actix::test]
async fn token_reservations_are_settled_across_processes() {
    let redis = RedisServer::start().expect("redis-server");
    let build = || Scheduler::builder().upstream(tokens_upstream()).redis(redis.url()).build().expect("scheduler");
    let (a, b) = (build(), build());
    let llm_b = b.upstream("llm").expect("configured");
    refunds_and_extra_charges(&a, &b).await;
    let status = llm_b.status().await.expect("status");
    assert_eq!(status.mode, Mode::Shared);
    assert!(status.budgets.tokens.is_some());
}

#[actix::test]
async fn an_estimate_larger_than_the_burst_is_refused_at_once() {
    let scheduler = common::isolated().upstream(tokens_upstream()).build().expect("scheduler");
    let llm = scheduler.upstream("llm").expect("configured");
    let started = Instant::now();
    let error = llm.request().tokens(1_001).acquire().await.expect_err("can never fit");
    assert_eq!(
        (error.kind(), error.requested(), error.burst()),
        (ErrorKind::InsufficientCapacity, Some(1_001), Some(1_000)),
        "{error:?}"
    );
    assert!(started.elapsed() < Duration::from_millis(100));
}

#[actix::test]
async fn waiters_sleep_until_the_budget_has_room_instead_of_polling() {
    let redis = RedisServer::start().expect("redis-server");
    let upstream = UpstreamConfig::builder("rpm").limit(10).requests_per_minute(600, 1).build().expect("config");
    let scheduler = Scheduler::builder().upstream(upstream).redis(redis.url()).build().expect("scheduler");
    scheduler.upstream("rpm").expect("configured").request().acquire().await.expect("warm up").succeeded();
    let mut con = redis.connection().expect("connection");
    let _: () = redis::cmd("CONFIG").arg("RESETSTAT").query(&mut con).expect("RESETSTAT");
    let started = Instant::now();
    let mut calls = Vec::new();
    for _ in 0..10 {
        let rpm = scheduler.upstream("rpm").expect("configured");
        calls.push(actix::spawn(async move {
            rpm.request().call(|_| async { Ok::<_, Outcome>(Instant::now()) }).await.expect("call")
        }));
    }
    let mut at = Vec::new();
    for call in calls {
        at.push(call.await.expect("task").duration_since(started));
    }
    at.sort();
    let took = started.elapsed();
    // One request every 100 ms.
    assert!(took >= Duration::from_millis(900) && took < Duration::from_millis(1_600), "{took:?}");
    for pair in at.windows(2) {
        assert!(pair[1] - pair[0] >= Duration::from_millis(80), "two requests closer than the budget allows: {at:?}");
    }
    let scripts = common::script_calls(&mut con);
    // acquire (one refused, one granted) + finish per request, and a few status/heartbeat calls.
    println!("{scripts} script calls for 10 requests");
    assert!(scripts <= 10 * 3 + 10, "{scripts} script calls for 10 requests: waiters are polling");
}

#[actix::test]
async fn usage_during_an_outage_is_charged_to_the_shared_budget() {
    let mut redis = RedisServer::start().expect("redis-server");
    let upstream = UpstreamConfig::builder("rpm")
        .limit(10)
        .requests_per_minute(60, 20)
        .renewed_lease(Duration::from_secs(3))
        .build()
        .expect("config");
    let scheduler = Scheduler::builder().upstream(upstream).redis(redis.url()).build().expect("scheduler");
    let rpm = scheduler.upstream("rpm").expect("configured");
    let requests_left = || async { rpm.status().await.expect("status").budgets.requests.expect("a requests budget") };
    assert_eq!(requests_left().await.0, 20);

    redis.kill().expect("kill -9");
    for _ in 0..10 {
        rpm.request().call(|_| async { Ok::<_, Outcome>(()) }).await.expect("calls go on in fallback");
    }
    assert_eq!(scheduler.mode().await.expect("mode"), Mode::Fallback);
    redis.restart().expect("restart, empty");
    let deadline = Instant::now() + Duration::from_secs(5);
    while scheduler.mode().await.expect("mode") != Mode::Shared {
        assert!(Instant::now() < deadline, "not back in shared mode");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let after = requests_left().await;
    // The restarted Redis knew nothing; the 10 requests made during the outage were handed to it
    // (one refills per second, and the outage lasted about a second).
    assert!(after.0 <= 12, "the outage's usage is missing from the shared budget: {after:?} left of 20");
}
