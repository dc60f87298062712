//! Requests and tokens per day (Groq's and Cerebras's RPD and TPD) through the public API: a
//! fleet on one Redis spends a day's requests exactly once, the callers beyond them are
//! refused at once with the time they would have needed (hours), and the tokens per day are
//! reserved and settled as the per-minute ones.

use std::time::{Duration, Instant};

use wavegate::{Budget, ErrorKind, Outcome, Scheduler, UpstreamConfig};
use wavegate_testkit::RedisServer;

mod common;

fn success() -> Outcome {
    Outcome::from_status(200, None, std::time::SystemTime::now())
}

/// 12 requests a day, all at once (the provider's own bucket), and a per-minute budget that
/// never binds here.
fn groq() -> UpstreamConfig {
    UpstreamConfig::builder("groq")
        .limit(50)
        .requests_per_minute(1_000, 1_000)
        .requests_per_day(12, 12)
        .build()
        .expect("config")
}

#[actix::test]
async fn a_fleet_spends_a_days_requests_once_and_refuses_the_rest_at_once() {
    let redis = RedisServer::start().expect("redis-server");
    let build = || Scheduler::builder().upstream(groq()).redis(redis.url()).build().expect("scheduler");
    let fleet = [build(), build(), build()];
    // 30 callers across three processes, each ready to wait 2 s.
    let calls = (0..30usize).map(|k| {
        let upstream = fleet[k % 3].upstream("groq").expect("groq");
        async move {
            let asked = Instant::now();
            match upstream.request().timeout(Duration::from_secs(2)).acquire().await {
                Ok(permit) => {
                    permit.report(success());
                    Ok(())
                }
                Err(error) => Err((error, asked.elapsed())),
            }
        }
    });
    let answers = futures_util::future::join_all(calls).await;
    let granted = answers.iter().filter(|a| a.is_ok()).count();
    assert_eq!(granted, 12, "the fleet granted other than the day's 12 requests");
    for (error, took) in answers.into_iter().filter_map(Result::err) {
        assert_eq!(error.kind(), ErrorKind::DeadlinePassed, "{error}");
        // One more request in 2 hours (a day ÷ 12): far beyond the 2 s anyone would wait.
        let needed = error.needed().expect("the time it would have needed");
        assert!(needed > Duration::from_secs(3_600), "{error}: needed {needed:?}");
        assert!(took < Duration::from_millis(1_500), "refused after {took:?}, not at once: {error}");
    }
    let status = fleet[0].upstream("groq").expect("groq").status().await.expect("status");
    let (left, next_ms) = status.budgets.requests_per_day.expect("a requests per day budget in the status");
    assert_eq!(left, 0);
    assert!(next_ms > 3_600_000 && next_ms <= 7_200_000, "one more in {next_ms} ms");
}

#[actix::test]
async fn tokens_per_day_are_reserved_settled_and_bound_an_estimate() {
    let config = UpstreamConfig::builder("groq").limit(50).tokens_per_day(10_000, 5_000).build().expect("config");
    let scheduler = common::isolated().upstream(config).build().expect("scheduler");
    let groq = scheduler.upstream("groq").expect("groq");
    // Above the day's burst: refused at once, naming the budget.
    let error = groq.request().tokens(5_001).acquire().await.expect_err("above the day's burst");
    assert_eq!((error.kind(), error.budget()), (ErrorKind::InsufficientCapacity, Some(Budget::TokensPerDay)));
    // Nine calls reserving 1,000 and using 500: the burst of 5,000 holds them all, as each
    // gives back half (without the settlement it would hold five).
    for k in 0..9 {
        let permit = groq
            .request()
            .tokens(1_000)
            .timeout(Duration::from_millis(500))
            .acquire()
            .await
            .unwrap_or_else(|e| panic!("call {k}: {e}"));
        permit.report_usage(success(), 500);
    }
    let status = groq.status().await.expect("status");
    assert_eq!(status.budgets.tokens_per_day.map(|(left, _)| left), Some(500));
    // 500 left: the next 1,000 wait for 500 more of the day (1.2 hours), refused at once.
    let started = Instant::now();
    let error = groq.request().tokens(1_000).timeout(Duration::from_secs(5)).acquire().await.expect_err("spent");
    assert!(started.elapsed() < Duration::from_millis(500), "{:?}", started.elapsed());
    assert!(error.needed().is_some_and(|n| n > Duration::from_secs(4_000)), "{error}");
}
