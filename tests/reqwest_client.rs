//! A borrowed `reqwest::Client` through the request builder (feature `reqwest`), from a plain
//! `#[tokio::test]`: responses classified by their status and `Retry-After` (`ByStatus`), the
//! mock provider counting what runs at once, reqwest's own error back typed.
//!
//! Run with `cargo test -p wavegate --features reqwest --test reqwest_client` (CI does).
#![cfg(feature = "reqwest")]

use std::time::Duration;

use futures_util::future::join_all;
use wavegate::config::Backoff;
use wavegate::{ByStatus, Outcome, Scheduler, TransportError, UpstreamConfig};
use wavegate_testkit::{MockUpstream, MockUpstreamConfig};

mod common;

fn scheduler(limit: u32) -> Scheduler {
    let upstream = UpstreamConfig::builder("llm")
        .limit(limit)
        .max_wait(Duration::from_secs(10))
        .backoff(Backoff { base: Duration::from_millis(2), max: Duration::from_millis(5), max_retries: 2 })
        .build()
        .expect("valid config");
    common::isolated().upstream(upstream).build().expect("scheduler")
}

#[tokio::test]
async fn a_borrowed_reqwest_client_calls_within_the_limit() {
    let mock =
        MockUpstream::start(MockUpstreamConfig { service_time: Duration::from_millis(20), ..Default::default() })
            .expect("mock provider");
    let scheduler = scheduler(3);
    let llm = scheduler.upstream("llm").expect("configured");
    let client = reqwest::Client::new();
    let url = format!("http://{}/v1/complete", mock.addr());
    let calls = (0..30).map(|_| llm.request().classify(ByStatus).call(|_| client.get(&url).send()));
    for response in join_all(calls).await {
        let response = response.expect("a call");
        assert_eq!(response.status(), 200);
        assert_eq!(response.text().await.expect("body"), "ok");
    }
    assert_eq!(mock.served(), 30);
    assert_eq!(mock.max_in_flight(), 3, "the provider saw more (or fewer) than the limit at once");
}

#[tokio::test]
async fn a_429_read_from_the_reqwest_response_is_retried_through_the_wave() {
    // The provider serves one at a time and answers 429 (Retry-After: 0) beyond that.
    let mock = MockUpstream::start(MockUpstreamConfig {
        capacity: Some(1),
        service_time: Duration::from_millis(30),
        retry_after: "0".to_string(),

        ..Default::default()
    })
    .expect("mock provider");
    let scheduler = scheduler(4);
    let llm = scheduler.upstream("llm").expect("configured");
    let client = reqwest::Client::new();
    let url = format!("http://{}/", mock.addr());
    let calls = (0..8).map(|_| llm.request().classify(ByStatus).call(|_| client.get(&url).send()));
    for response in join_all(calls).await {
        assert_eq!(response.expect("every call ends served").status(), 200);
    }
    assert!(mock.rate_limited() >= 1, "the provider never answered 429");
    assert_eq!(mock.served(), 8);
    // The 429s reached the wave: the limit was cut below 4.
    assert!(llm.status().await.expect("status").limit < 4);
}

#[tokio::test]
async fn reqwests_own_error_comes_back_typed() {
    // A port nobody listens on: connection refused.
    let port = wavegate_testkit::free_port().expect("a free port");
    let scheduler = scheduler(2);
    let llm = scheduler.upstream("llm").expect("configured");
    let client = reqwest::Client::new();
    let url = format!("http://127.0.0.1:{port}/");
    let error = llm.request().classify(ByStatus).call(|_| client.get(&url).send()).await.expect_err("refused");
    let (Some(outcome), Some(attempts), Some(source)) = (error.outcome(), error.attempts(), error.source_error())
    else {
        panic!("expected reqwest's error, got {error:?}");
    };
    assert_eq!(*outcome, Outcome::from_transport(TransportError::Connect));
    assert_eq!(attempts, 3, "one attempt and two retries of a connect failure");
    assert!(source.is_connect(), "{source:?}");
    // And through std's error chain.
    let chained = std::error::Error::source(&error).expect("a source");
    assert!(chained.downcast_ref::<reqwest::Error>().is_some());
}
