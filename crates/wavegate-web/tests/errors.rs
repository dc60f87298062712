//! wavegate's errors as responses: each made for real by a local scheduler, then rendered.

use std::future::pending;
use std::time::{Duration, SystemTime};

use wavegate::config::Backoff;
use wavegate::{Outcome, Scheduler, TransportError, Upstream, UpstreamConfig};
use wavegate_web::{ErrorBody, WebError};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// An upstream named `name` whose transient failures are not retried, with a short call timeout.
fn upstream(name: &str) -> (Scheduler, Upstream) {
    let config = UpstreamConfig::builder(name)
        .limit(1)
        .call_timeout(ms(20))
        .max_wait(ms(50))
        .backoff(Backoff { max_retries: 0, ..Backoff::default() })
        .build()
        .expect("config");
    let scheduler = Scheduler::builder().upstream(config).build().expect("scheduler");
    let upstream = scheduler.upstream(name).expect("configured");
    (scheduler, upstream)
}

fn rendered(error: impl Into<WebError>) -> (u16, ErrorBody, Option<u64>) {
    let error = error.into();
    (error.status(), error.body(), error.retry_after_seconds())
}

#[tokio::test]
async fn a_call_timeout_is_a_504_that_says_it_timed_out() {
    let (_s, llm) = upstream("timeout");
    let error = llm.request().call(|_| pending::<Result<(), Outcome>>()).await.expect_err("times out");
    let (status, body, retry_after) = rendered(error);
    assert_eq!((status, body.code, body.upstream_status, retry_after), (504, "upstream_timeout", None, None));
    assert!(body.message.contains("timed out"), "{}", body.message);
}

#[tokio::test]
async fn the_clients_own_timeout_is_a_504_too() {
    let (_s, llm) = upstream("client-timeout");
    let error = llm
        .request()
        .call(|_| async { Err::<(), _>(std::io::Error::from(std::io::ErrorKind::TimedOut)) })
        .await
        .expect_err("the client timed out");
    let (status, body, _) = rendered(error);
    assert_eq!((status, body.code), (504, "upstream_timeout"));
    assert!(body.message.contains("timed out"), "{}", body.message);
}

#[tokio::test]
async fn other_upstream_failures_stay_502() {
    let (_s, llm) = upstream("failures");
    let now = SystemTime::now();
    for outcome in [
        Outcome::from_transport(TransportError::Connect),
        Outcome::from_transport(TransportError::Reset),
        // The provider's own 504 is an answer, not a timeout of this call.
        Outcome::from_status(504, None, now),
        Outcome::from_status(500, None, now),
        Outcome::from_status(400, None, now),
    ] {
        let error = llm.request().call(|_| async move { Err::<(), _>(outcome) }).await.expect_err("fails");
        let message = error.to_string();
        let (status, body, retry_after) = rendered(error);
        assert_eq!((status, body.code, retry_after), (502, "upstream_error", None), "{outcome}");
        assert_eq!(body.message, message);
        assert_eq!(body.upstream_status, outcome.status());
    }
}

#[tokio::test]
async fn a_deadline_stays_its_own_504_with_retry_after() {
    let (_s, llm) = upstream("deadline");
    let error = llm.request().timeout(ms(5)).call(|_| pending::<Result<(), Outcome>>()).await.expect_err("late");
    let (status, body, retry_after) = rendered(error);
    assert_eq!((status, body.code, retry_after), (504, "deadline_passed", Some(1)));
}

#[tokio::test]
async fn overloads_are_503_with_retry_after() {
    let (_s, llm) = upstream("overload");
    let held = llm.request().acquire().await.expect("the only permit");
    let error = llm.request().acquire().await.expect_err("no permit within max_wait");
    let (status, body, retry_after) = rendered(error);
    assert_eq!((status, body.code, retry_after), (503, "waited_too_long", Some(1)));
    held.succeeded();
}
