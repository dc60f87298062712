//! The request builder on an upstream handle, from plain `#[tokio::test]`s: closures that
//! borrow, the caller's own error and value back untouched, classification of the caller's
//! result, deadlines, token metering.

use std::cell::Cell;
use std::io;
use std::time::{Duration, Instant, SystemTime};

use wavegate::config::{Backoff, UpstreamConfigBuilder};
use wavegate::{Error, ErrorKind, Outcome, Scheduler, UnknownUpstream, UpstreamConfig, UpstreamError};

mod common;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn scheduler(config: UpstreamConfigBuilder) -> Scheduler {
    common::isolated().upstream(config.build().expect("valid config")).build().expect("scheduler")
}

fn llm() -> UpstreamConfigBuilder {
    UpstreamConfig::builder("llm").limit(2).max_wait(Duration::from_secs(5))
}

/// Stands for an HTTP client: not `Sync`, not `'static` in use, lent to the closure.
struct Client {
    calls: Cell<u32>,
    base: String,
}

impl Client {
    /// Answers with a slice of its own base URL and of the path: a value that borrows both.
    async fn get<'a>(&'a self, path: &'a str) -> Result<(&'a str, &'a str), AppError> {
        self.calls.set(self.calls.get() + 1);
        tokio::task::yield_now().await;
        Ok((&self.base, path))
    }
}

/// The application's own error type.
#[derive(Debug)]
enum AppError {
    /// The provider answered a status, with a body.
    Status { code: u16, body: String },
    /// Below HTTP.
    Network(io::Error),
}

impl UpstreamError for AppError {
    fn outcome(&self) -> Outcome {
        match self {
            AppError::Status { code, .. } => Outcome::from_status(*code, None, SystemTime::now()),
            AppError::Network(error) => error.outcome(),
        }
    }
}

#[tokio::test]
async fn a_closure_may_borrow_a_local_client_and_a_str_and_return_borrowed_values() {
    let scheduler = scheduler(llm());
    let upstream = scheduler.upstream("llm").expect("configured");
    let client = Client { calls: Cell::new(0), base: "http://provider".to_string() };
    let path = String::from("/v1/complete");
    let path: &str = &path;
    let (base, got) = upstream.request().call(|_attempt| client.get(path)).await.expect("a call");
    assert_eq!((base, got), ("http://provider", "/v1/complete"));
    assert_eq!(client.calls.get(), 1);
    // The deprecated by-name shorthand takes borrowing closures too.
    #[allow(deprecated)]
    let base = scheduler.call("llm", |_| async { Ok::<_, Outcome>(client.base.as_str()) }).await.expect("a call");
    assert_eq!(base, "http://provider");
}

#[tokio::test]
async fn the_callers_error_comes_back_typed_and_untouched() {
    let scheduler = scheduler(llm());
    let upstream = scheduler.upstream("llm").expect("configured");
    let error = upstream
        .request()
        .call(|_| async { Err::<(), _>(AppError::Status { code: 400, body: "prompt too long".to_string() }) })
        .await
        .expect_err("a 400");
    let (Some(outcome), Some(attempts), Some(AppError::Status { code, body })) =
        (error.outcome(), error.attempts(), error.source_error())
    else {
        panic!("expected the caller's error, got {error:?}");
    };
    assert_eq!(
        (*outcome, attempts, *code, body.as_str()),
        (Outcome::ClientError { status: 400 }, 1, 400, "prompt too long")
    );
    assert_eq!(error.code(), "upstream_error");
    assert!(matches!(error.into_source(), Some(AppError::Status { code: 400, .. })));
}

#[tokio::test]
async fn a_transient_error_is_retried_then_comes_back_typed() {
    let scheduler = scheduler(llm().backoff(Backoff { base: ms(2), max: ms(5), max_retries: 2 }));
    let upstream = scheduler.upstream("llm").expect("configured");
    let invoked = Cell::new(0);
    let error = upstream
        .request()
        .call(|_| {
            invoked.set(invoked.get() + 1);
            async { Err::<(), _>(AppError::Network(io::Error::from(io::ErrorKind::ConnectionReset))) }
        })
        .await
        .expect_err("resets only");
    assert_eq!(invoked.get(), 3, "one attempt and max_retries = 2 retries");
    let (Some(3), Some(AppError::Network(io))) = (error.attempts(), error.source_error()) else {
        panic!("expected the caller's io::Error after 3 attempts, got {error:?}");
    };
    assert_eq!(io.kind(), io::ErrorKind::ConnectionReset);
    // std's error chain reaches the caller's error.
    let io_error =
        upstream.request().call(|_| async { Err::<(), _>(io::Error::other("bad data")) }).await.expect_err("fails");
    let source = std::error::Error::source(&io_error).expect("a source");
    assert_eq!(source.to_string(), "bad data");
}

/// A minimal reply: a status and a body.
#[derive(Debug)]
struct Reply {
    status: u16,
    retry_after: Option<&'static str>,
    body: &'static str,
}

fn by_status(result: &Result<Reply, AppError>) -> Outcome {
    match result {
        Ok(reply) => Outcome::from_status(reply.status, reply.retry_after, SystemTime::now()),
        Err(error) => error.outcome(),
    }
}

#[tokio::test]
async fn the_callers_result_is_classified_a_429_retried_a_final_4xx_returned_as_it_came() {
    let scheduler = scheduler(llm());
    let upstream = scheduler.upstream("llm").expect("configured");
    let invoked = Cell::new(0u32);
    let reply = upstream
        .request()
        .classify(by_status)
        .call(|attempt| {
            invoked.set(invoked.get() + 1);
            async move {
                Ok(match attempt.number {
                    1 => Reply { status: 429, retry_after: Some("0"), body: "slow down" },
                    _ => Reply { status: 400, retry_after: None, body: "{\"error\":\"prompt too long\"}" },
                })
            }
        })
        .await
        .expect("the 400 comes back as the caller's value");
    assert_eq!(invoked.get(), 2, "the 429 was retried, the 400 not");
    assert_eq!((reply.status, reply.body), (400, "{\"error\":\"prompt too long\"}"));
    // The 429 was reported to the wave: the limit was cut.
    assert!(upstream.status().await.expect("status").limit < 2);
}

#[tokio::test]
async fn a_deadline_bounds_the_wait_and_the_whole_request() {
    let scheduler = scheduler(llm().limit(1));
    let upstream = scheduler.upstream("llm").expect("configured");
    let held = upstream.request().acquire().await.expect("the only permit");
    let start = Instant::now();
    let error = upstream.request().timeout(ms(80)).acquire().await.expect_err("no permit before the deadline");
    assert_eq!(error.kind(), ErrorKind::DeadlinePassed, "{error:?}");
    assert!(error.is_timeout() && error.to_string().contains("timed out"), "{error}");
    let waited = start.elapsed();
    assert!(waited >= ms(75) && waited < ms(1_000), "acquire gave up after {waited:?} (deadline 80 ms, max_wait 5 s)");
    let start = Instant::now();
    let error = upstream
        .request()
        .deadline(Instant::now() + ms(80))
        .call(|_| async { Ok::<_, Outcome>(()) })
        .await
        .expect_err("no permit before the deadline");
    assert_eq!((error.kind(), error.attempts()), (ErrorKind::DeadlinePassed, Some(0)), "{error:?}");
    assert!(start.elapsed() < ms(1_000));
    held.succeeded();
    // With room, a deadline in the past is refused before any wait.
    let error = upstream.request().deadline(Instant::now()).acquire().await.expect_err("past");
    assert_eq!(error.kind(), ErrorKind::DeadlinePassed, "{error:?}");
}

#[tokio::test]
async fn tokens_are_reserved_and_settled_with_the_meter() {
    let scheduler = scheduler(llm().tokens_per_minute(60_000, 1_000));
    let upstream = scheduler.upstream("llm").expect("configured");
    let tokens_left = || async { upstream.status().await.expect("status").budgets.tokens.expect("a tokens budget").0 };
    assert_eq!(tokens_left().await, 1_000);
    let used = upstream
        .request()
        .tokens(600)
        .meter(|used: &u64| *used)
        .call(|_| async { Ok::<u64, Outcome>(100) })
        .await
        .expect("a call");
    assert_eq!(used, 100);
    // 600 reserved, 100 used: 500 refunded (a few more may have refilled meanwhile).
    let left = tokens_left().await;
    assert!((900..=910).contains(&left), "{left} tokens left after using 100 of 1000");
    // An estimate above the burst can never fit.
    let error = upstream.request().tokens(1_001).acquire().await.expect_err("never fits");
    assert_eq!(
        (error.kind(), error.requested(), error.burst()),
        (ErrorKind::InsufficientCapacity, Some(1_001), Some(1_000)),
        "{error:?}"
    );
}

#[tokio::test]
async fn a_provider_that_keeps_the_estimate_is_settled_to_it() {
    // Refilled at 10 tokens a second: what the test sees is what was charged.
    let scheduler = scheduler(llm().tokens_per_minute(600, 1_000).keeps_estimate(true));
    let upstream = scheduler.upstream("llm").expect("configured");
    let tokens_left = || async { upstream.status().await.expect("status").budgets.tokens.expect("a tokens budget").0 };
    let call = |answer: Result<u64, Outcome>| {
        upstream.request().tokens(300).meter(|used: &u64| *used).call(move |_| async move { answer })
    };
    assert_eq!(call(Ok(100)).await.expect("a call"), 100);
    // 300 reserved, 100 used: the provider keeps 300 charged, so nothing comes back.
    let left = tokens_left().await;
    assert!((700..=705).contains(&left), "{left} tokens left: settled to the estimate, not the usage");
    // A request the provider refused (a 400) was not charged: its reservation comes back.
    let refused = Outcome::from_status(400, None, std::time::SystemTime::now());
    call(Err(refused)).await.expect_err("a client error");
    let after = tokens_left().await;
    assert!(after >= left && after <= left + 5, "{after} tokens left after a refused request (before: {left})");
}

#[tokio::test]
async fn an_unknown_upstream_is_refused_once_at_resolution() {
    let scheduler = scheduler(llm());
    let UnknownUpstream { name, known } = scheduler.upstream("lmm").expect_err("not configured");
    assert_eq!((name.as_str(), known.as_str()), ("lmm", "llm"));
    let as_error: Error<AppError> = scheduler.upstream("lmm").map(|_| ()).map_err(Error::from).expect_err("unknown");
    assert_eq!(as_error.code(), "unknown_upstream");
}

#[tokio::test]
async fn several_local_schedulers_for_one_upstream_are_counted_while_they_live() {
    let build = || scheduler(UpstreamConfig::builder("twice").limit(2));
    let first = build();
    let count = |s: &Scheduler| {
        let s = s.clone();
        async move { s.upstream("twice").expect("configured").status().await.expect("status").schedulers_in_process }
    };
    assert_eq!(count(&first).await, 1);
    let second = build();
    // Clones are the same scheduler; a second build is a second limit.
    let _clone = first.clone();
    assert_eq!((count(&first).await, count(&second).await), (2, 2));
    drop(second);
    assert_eq!(count(&first).await, 1);
}
