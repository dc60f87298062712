//! Transient server errors through the public API against a real HTTP mock (issue 23, item 4):
//! 500, 502, 503, 504 and a connection closed before any byte of the answer are retried with
//! full jitter inside the retry budget and the deadline; 400, 401, 403, 404 and 422 never; an
//! upstream whose calls are not safe to repeat opts out.
//!
//! Each test counts what the mock really saw (calls, faults), so it fails when the claim in
//! its name is false. Local mode: the retry policy is the same in shared mode.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering::SeqCst};
use std::time::{Duration, SystemTime};

use futures_util::future::join_all;
use wavegate::config::{Backoff, BreakerConfig, RetryBudgetConfig, UpstreamConfigBuilder};
use wavegate::{ErrorKind, Outcome, Scheduler, TransportError, UpstreamConfig, UpstreamError};
use wavegate_testkit::{MockUpstream, MockUpstreamConfig, http_get};

mod common;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// `x` with a limit of 10 and a short backoff (the default's 200 ms ceiling only slows tests).
fn x() -> UpstreamConfigBuilder {
    UpstreamConfig::builder("x").limit(10).backoff(Backoff { base: ms(5), max: ms(50), max_retries: 3 })
}

fn scheduler(config: UpstreamConfigBuilder) -> Scheduler {
    common::isolated().upstream(config.build().expect("valid configuration")).build().expect("scheduler")
}

fn mock(fault_rate: f64, fault: Option<u16>) -> MockUpstream {
    MockUpstream::start(MockUpstreamConfig {
        service_time: ms(1),
        fault_rate,
        fault,
        fault_seed: 23,
        ..Default::default()
    })
    .expect("mock upstream")
}

/// One `GET /` as a caller's closure makes it: 200 is `Ok`, another status its outcome, an
/// I/O failure (a connection closed before the head: `InvalidData`) its transport outcome.
async fn get(addr: std::net::SocketAddr) -> Result<(), Outcome> {
    match http_get(addr, "/", Duration::from_secs(5)).await {
        Ok(reply) if reply.status == 200 => Ok(()),
        Ok(reply) => Err(Outcome::from_status(reply.status, reply.retry_after.as_deref(), SystemTime::now())),
        Err(error) => Err(error.outcome()),
    }
}

/// Runs `jobs` calls at once; how many failed, and the first attempts and retries the closure saw.
async fn run(scheduler: &Scheduler, addr: std::net::SocketAddr, jobs: usize) -> (usize, u32, u32) {
    let upstream = scheduler.upstream("x").expect("configured");
    let (firsts, retries) = (Arc::new(AtomicU32::new(0)), Arc::new(AtomicU32::new(0)));
    let calls = (0..jobs).map(|_| {
        let (upstream, firsts, retries) = (upstream.clone(), firsts.clone(), retries.clone());
        async move {
            upstream
                .request()
                .call(|attempt| {
                    let counter = if attempt.number == 1 { &firsts } else { &retries };
                    counter.fetch_add(1, SeqCst);
                    get(addr)
                })
                .await
        }
    });
    let failed = join_all(calls).await.into_iter().filter(Result::is_err).count();
    (failed, firsts.load(SeqCst), retries.load(SeqCst))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_percent_transient_500s_fail_no_job() {
    let mock = mock(0.05, Some(500));
    let scheduler = scheduler(x());
    let jobs = 400;
    let (failed, firsts, retries) = run(&scheduler, mock.addr(), jobs).await;
    println!("500s: {} of {} calls, jobs failed {failed} of {jobs}, retries {retries}", mock.faulted(), mock.calls());
    assert_eq!(failed, 0, "a transient 500 must be retried");
    assert_eq!(firsts as usize, jobs);
    assert!(mock.faulted() >= 5, "the mock answered too few 500s to test anything: {}", mock.faulted());
    assert_eq!(u64::from(retries), mock.faulted(), "each 500 retried once, nothing else retried");
    assert_eq!(mock.served(), jobs as u64);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_closed_before_any_byte_is_retried() {
    let mock = mock(0.05, None);
    let scheduler = scheduler(x());
    let jobs = 200;
    let (failed, _, retries) = run(&scheduler, mock.addr(), jobs).await;
    assert_eq!(failed, 0);
    assert!(mock.faulted() >= 3, "{}", mock.faulted());
    assert_eq!(u64::from(retries), mock.faulted());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_transient_status_is_retried() {
    for status in [500, 502, 503, 504] {
        let mock = mock(0.2, Some(status));
        let scheduler = scheduler(x());
        let (failed, _, retries) = run(&scheduler, mock.addr(), 50).await;
        assert_eq!(failed, 0, "{status}");
        assert!(mock.faulted() > 0, "{status}");
        assert_eq!(u64::from(retries), mock.faulted(), "{status}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retries_stay_inside_the_retry_budget() {
    // Every call fails: each job would retry 3 times without a budget. The breaker is kept
    // closed (it would otherwise stop the first attempts and hide the budget).
    let mock = mock(1.0, Some(500));
    let budget = RetryBudgetConfig { ratio: 0.2, min_per_second: 1, ttl: Duration::from_secs(10) };
    let breaker = BreakerConfig { failure_rate: 1.0, minimum_calls: 1_000_000, ..Default::default() };
    let scheduler = scheduler(x().retry_budget(budget).breaker(breaker));
    let jobs = 100;
    let (failed, firsts, retries) = run(&scheduler, mock.addr(), jobs).await;
    println!("all 500s: {jobs} jobs, {firsts} first attempts, {retries} retries");
    assert_eq!(failed, jobs);
    let allowed = 0.2 * f64::from(firsts) + 10.0;
    assert!(f64::from(retries) <= allowed, "{retries} retries above the budget's {allowed}");
    assert!(f64::from(retries) >= allowed - 1.0, "the budget should be used: {retries} of {allowed}");
    assert_eq!(mock.calls(), u64::from(firsts + retries));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_errors_are_never_retried() {
    for status in [400, 401, 403, 404, 422] {
        let mock = mock(1.0, Some(status));
        let scheduler = scheduler(x());
        let upstream = scheduler.upstream("x").expect("configured");
        let error = upstream.request().call(|_| get(mock.addr())).await.expect_err("a client error");
        assert_eq!(error.kind(), ErrorKind::Upstream, "{status}");
        assert_eq!(error.outcome().and_then(Outcome::status), Some(status));
        assert_eq!(mock.calls(), 1, "{status} must not be retried");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_can_opt_out_of_transient_retries() {
    for fault in [Some(500), Some(503), None] {
        let mock = mock(1.0, fault);
        let scheduler = scheduler(x().retry_transient(false));
        let upstream = scheduler.upstream("x").expect("configured");
        let error = upstream.request().call(|_| get(mock.addr())).await.expect_err("a failure");
        assert_eq!(error.kind(), ErrorKind::Upstream, "{fault:?}");
        assert_eq!(mock.calls(), 1, "{fault:?}: a call that is not safe to repeat is not repeated");
    }
    // A request that never reached the provider is safe to send again, opted out or not.
    let scheduler = scheduler(x().retry_transient(false));
    let upstream = scheduler.upstream("x").expect("configured");
    let answer = upstream
        .request()
        .call(|attempt| async move {
            if attempt.number == 1 { Err(Outcome::from_transport(TransportError::Connect)) } else { Ok(attempt.number) }
        })
        .await
        .expect("retried after a connect error");
    assert_eq!(answer, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_402_is_a_spent_quota_that_stops_the_upstream_after_one_call() {
    let mock = mock(1.0, Some(402));
    let scheduler = scheduler(x());
    let upstream = scheduler.upstream("x").expect("configured");
    let error = upstream.request().call(|_| get(mock.addr())).await.expect_err("402");
    assert_eq!(error.kind(), ErrorKind::QuotaExhausted, "{error}");
    assert_eq!(mock.calls(), 1, "a spent quota is not retried");
    let again = upstream.request().call(|_| get(mock.addr())).await.expect_err("still spent");
    assert_eq!(again.kind(), ErrorKind::QuotaExhausted);
    assert_eq!(mock.calls(), 1, "refused without a call until the pause ends");
    assert!(upstream.status().await.expect("status").quota_exhausted_for.is_some());
}
