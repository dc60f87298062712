//! A plain tokio program (no actix anywhere) calling a provider through wavegate with a
//! borrowed `reqwest::Client`; the caller's own error printed. It runs against the testkit's
//! mock provider, which serves 4 calls at once and answers 429 beyond that:
//!
//! ```sh
//! cargo run --example plain_tokio --features reqwest
//! ```
//!
//! (`tests/examples.rs` runs it too.)

use std::time::Duration;

use futures_util::future::join_all;
use wavegate::{ByStatus, Scheduler, UpstreamConfig};
use wavegate_testkit::{MockUpstream, MockUpstreamConfig, free_port};

/// Runs the example; fails if a call did not end as described.
#[tokio::main]
pub(crate) async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let provider = MockUpstream::start(MockUpstreamConfig {
        capacity: Some(4),
        service_time: Duration::from_millis(20),
        retry_after: "0".to_string(),
        ..MockUpstreamConfig::default()
    })?;
    // No actix system here: the scheduler starts its actors on a thread of its own.
    let scheduler = Scheduler::builder()
        .upstream(UpstreamConfig::builder("llm").limit(6).max_wait(Duration::from_secs(10)).build()?)
        .build()?;
    let llm = scheduler.upstream("llm")?;

    // The client is borrowed by every call's closure: nothing needs to be 'static.
    let client = reqwest::Client::new();
    let url = format!("http://{}/v1/complete", provider.addr());
    let calls = (0..40).map(|_| llm.request().classify(ByStatus).call(|_attempt| client.get(&url).send()));
    let answered = join_all(calls).await.into_iter().filter(|reply| reply.as_ref().is_ok_and(|r| r.status() == 200));
    let answered = answered.count();
    println!(
        "{answered}/40 answered 200; the provider saw at most {} calls at once (capacity 4, limit 6) and drew {} 429s, \
         all retried through the wave",
        provider.max_in_flight(),
        provider.rate_limited()
    );
    if answered != 40 {
        return Err(format!("{} calls failed", 40 - answered).into());
    }

    // The caller's own error comes back typed: nobody listens on this port.
    let nowhere = format!("http://127.0.0.1:{}/", free_port()?);
    let error = match llm.request().classify(ByStatus).call(|_attempt| client.get(&nowhere).send()).await {
        Ok(response) => return Err(format!("a closed port answered: {response:?}").into()),
        Err(error) => error,
    };
    let Some(own) = error.source_error().filter(|own| own.is_connect()) else {
        return Err(format!("expected reqwest's connect error, got {error:?}").into());
    };
    println!("after {} attempts, reqwest's own error: {own}", error.attempts().unwrap_or_default());
    Ok(())
}
