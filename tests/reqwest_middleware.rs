//! The reqwest-middleware middleware (feature `reqwest-middleware`): a `ClientWithMiddleware`
//! whose requests go through the scheduler, routed by host or by an extension, against the
//! mock provider, which counts what runs at once.
//!
//! Run with `cargo test -p wavegate --features reqwest-middleware --test reqwest_middleware`
//! (CI does).
#![cfg(feature = "reqwest-middleware")]

use std::time::Duration;

use futures_util::future::join_all;
use reqwest_middleware::ClientBuilder;
use wavegate::UpstreamConfig;
use wavegate::middleware::reqwest::WavegateMiddleware;
use wavegate_testkit::{MockUpstream, MockUpstreamConfig};

mod common;

fn config(name: &str, limit: u32) -> UpstreamConfig {
    UpstreamConfig::builder(name).limit(limit).max_wait(Duration::from_secs(10)).build().expect("config")
}

#[tokio::test]
async fn requests_routed_by_host_never_exceed_the_limit_and_429s_are_retried() {
    let mock = MockUpstream::start(MockUpstreamConfig {
        capacity: Some(2),
        service_time: Duration::from_millis(20),
        retry_after: "0".to_string(),

        ..Default::default()
    })
    .expect("mock provider");
    let scheduler = common::isolated().upstream(config("llm", 3)).build().expect("scheduler");
    let llm = scheduler.upstream("llm").expect("configured");
    let client = ClientBuilder::new(reqwest::Client::new())
        .with(WavegateMiddleware::new().host("127.0.0.1", llm.clone()))
        .build();
    let url = format!("http://{}/", mock.addr());
    let replies = join_all((0..30).map(|_| client.get(&url).send())).await;
    for reply in replies {
        assert_eq!(reply.expect("a call").status(), 200, "a 429 reached the caller");
    }
    assert_eq!(mock.served(), 30);
    assert!(mock.max_in_flight() <= 3, "the provider saw {} at once with a limit of 3", mock.max_in_flight());
    // The provider's capacity is 2: the 429s it drew were retried and cut the limit.
    assert!(mock.rate_limited() >= 1);
    assert!(llm.status().await.expect("status").limit < 3);
}

#[tokio::test]
async fn an_extension_names_the_upstream_and_unknown_hosts_pass_through() {
    let mock =
        MockUpstream::start(MockUpstreamConfig { service_time: Duration::from_millis(20), ..Default::default() })
            .expect("mock provider");
    let scheduler =
        common::isolated().upstream(config("llm", 10)).upstream(config("images", 1)).build().expect("scheduler");
    let images = scheduler.upstream("images").expect("configured");
    let client = ClientBuilder::new(reqwest::Client::new())
        .with(WavegateMiddleware::new().host("127.0.0.1", scheduler.upstream("llm").expect("configured")))
        .build();
    let url = format!("http://{}/", mock.addr());
    // Named on the request: the images upstream (limit 1), whatever the host.
    let replies = join_all((0..6).map(|_| client.get(&url).with_extension(images.clone()).send())).await;
    assert!(replies.into_iter().all(|reply| reply.expect("a call").status() == 200));
    assert_eq!(mock.max_in_flight(), 1, "the extension's upstream (limit 1) was not the one applied");
    // A host no upstream claims goes through untouched (no limit: all at once).
    mock.reset_max_in_flight();
    let other = format!("http://localhost:{}/", mock.addr().port());
    let replies = join_all((0..6).map(|_| client.get(&other).send())).await;
    assert!(replies.into_iter().all(|reply| reply.expect("a call").status() == 200));
    assert!(mock.max_in_flight() > 1, "an unknown host was limited");
}

/// A streamed response (server-sent events) holds its permit until its body is read to the end
/// or dropped, and its final usage settles the tokens budget.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamed_response_holds_its_permit_until_its_body_ends() {
    use wavegate_testkit::{MockSse, MockSseConfig};
    let mock = MockSse::start(MockSseConfig::default()).expect("mock provider");
    // 60 tokens a minute: the budget's figures stay put during the test.
    let config = UpstreamConfig::builder("llm")
        .limit(2)
        .tokens_per_minute(60, 10_000)
        .max_wait(Duration::from_secs(10))
        .build()
        .expect("config");
    let scheduler = common::isolated().upstream(config).build().expect("scheduler");
    let llm = scheduler.upstream("llm").expect("configured");
    let client = ClientBuilder::new(reqwest::Client::new())
        .with(WavegateMiddleware::new().host("127.0.0.1", llm.clone()))
        .build();
    let url = format!("http://{}/v1/chat/completions", mock.addr());
    let read = join_all((0..6).map(|_| async {
        let mut response = client.get(&url).send().await.expect("a response");
        let mut bytes = 0;
        while let Some(chunk) = response.chunk().await.expect("a chunk") {
            bytes += chunk.len();
        }
        bytes
    }))
    .await;
    assert!(read.iter().all(|&bytes| bytes > 1000), "{read:?}");
    assert_eq!(mock.completed(), 6);
    assert_eq!(mock.max_open(), 2, "the provider had {} streams open with a limit of 2", mock.max_open());
    let status = llm.status().await.expect("status");
    assert_eq!(status.in_flight_local, 0);
    // Nothing was reserved; each stream's final usage (12 + 20 tokens) was charged.
    let left = status.budgets.tokens.expect("a tokens budget").0;
    assert!((10_000 - 6 * 32..10_000 - 6 * 32 + 10).contains(&left), "{left} tokens left");

    // A response dropped after its first chunk gives its permit back at once.
    let single = scheduler.upstream("llm").expect("configured");
    let mut response = client.get(&url).send().await.expect("a response");
    response.chunk().await.expect("a chunk").expect("not the end");
    assert_eq!(single.status().await.expect("status").in_flight_local, 1);
    drop(response);
    assert_eq!(single.status().await.expect("status").in_flight_local, 0);
}
