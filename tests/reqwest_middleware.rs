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
