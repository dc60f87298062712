//! No closure at all: a `reqwest-middleware` client whose requests to the provider's host go
//! through wavegate. It runs against the testkit's mock provider, which serves 4 calls at once
//! and answers 429 beyond that:
//!
//! ```sh
//! cargo run --example reqwest_middleware --features reqwest-middleware
//! ```
//!
//! (`tests/examples.rs` runs it too.)

use std::time::Duration;

use futures_util::future::join_all;
use reqwest_middleware::ClientBuilder;
use wavegate::middleware::reqwest::WavegateMiddleware;
use wavegate::{Scheduler, UpstreamConfig};
use wavegate_testkit::{MockUpstream, MockUpstreamConfig};

/// Runs the example; fails if a call did not end as described.
#[tokio::main]
pub(crate) async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let provider = MockUpstream::start(MockUpstreamConfig {
        capacity: Some(4),
        service_time: Duration::from_millis(20),
        retry_after: "0".to_string(),
        ..MockUpstreamConfig::default()
    })?;
    let scheduler = Scheduler::builder()
        .upstream(UpstreamConfig::builder("llm").limit(6).max_wait(Duration::from_secs(10)).build()?)
        .build()?;
    let client = ClientBuilder::new(reqwest::Client::new())
        .with(WavegateMiddleware::new().host("127.0.0.1", scheduler.upstream("llm")?))
        .build();

    let url = format!("http://{}/v1/complete", provider.addr());
    let replies = join_all((0..40).map(|_| client.get(&url).send())).await;
    let answered = replies.into_iter().filter(|reply| reply.as_ref().is_ok_and(|r| r.status() == 200)).count();
    println!(
        "{answered}/40 answered 200 through the middleware; the provider saw at most {} at once (capacity 4, limit 6) \
         and drew {} 429s, none of which reached the caller",
        provider.max_in_flight(),
        provider.rate_limited()
    );
    if answered != 40 {
        return Err(format!("{} calls failed", 40 - answered).into());
    }
    Ok(())
}
