//! Streamed answers (server-sent events) hold their permit until they end: a mock LLM provider
//! streams each answer over a second (20 events, then OpenAI's `include_usage` chunk with 12 +
//! 20 tokens); the upstream's limit is 2 and 6 callers stream at once, first through
//! `call_stream` with a plain reqwest client, then through the reqwest middleware:
//!
//! ```sh
//! cargo run --example streaming --features reqwest-middleware
//! ```
//!
//! (`tests/examples.rs` runs it too.)

use std::time::Duration;

use futures_util::StreamExt;
use futures_util::future::join_all;
use reqwest_middleware::ClientBuilder;
use wavegate::middleware::reqwest::WavegateMiddleware;
use wavegate::{ByStatus, Scheduler, SseUsage, UpstreamConfig};
use wavegate_testkit::{MockSse, MockSseConfig};

/// The body of a reqwest response as a stream of chunks, ending at its first error.
fn chunks(
    response: reqwest::Response,
) -> impl futures_util::Stream<Item = Result<impl AsRef<[u8]>, reqwest::Error>> + Unpin {
    Box::pin(futures_util::stream::unfold(Some(response), |response| async move {
        let mut response = response?;
        match response.chunk().await {
            Ok(Some(chunk)) => Some((Ok(chunk), Some(response))),
            Ok(None) => None,
            Err(error) => Some((Err(error), None)),
        }
    }))
}

/// Runs the example; fails if the provider saw more streams at once than the limit, or if the
/// tokens were not settled from the streams' usage.
#[tokio::main]
pub(crate) async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let provider = MockSse::start(MockSseConfig::default())?;
    let scheduler = Scheduler::builder()
        .upstream(
            UpstreamConfig::builder("llm")
                .limit(2)
                // 60 tokens a minute, a burst of 10,000: the figures below stay put while it runs.
                .tokens_per_minute(60, 10_000)
                .max_wait(Duration::from_secs(10))
                .build()?,
        )
        .build()?;
    let llm = scheduler.upstream("llm")?;
    let url = format!("http://{}/v1/chat/completions", provider.addr());

    // 1. `call_stream`: a 429 before the stream began would be retried; the stream holds the
    //    permit to its end and its final usage settles the 500 tokens reserved.
    let client = reqwest::Client::new();
    let streamed = join_all((0..6).map(|_| async {
        let mut answer = llm
            .request()
            .tokens(500)
            .classify(ByStatus)
            .meter(SseUsage::new())
            .call_stream(|_attempt| client.get(&url).send(), chunks)
            .await?;
        let mut bytes = 0;
        while let Some(chunk) = answer.next().await {
            bytes += chunk?.as_ref().len();
        }
        Ok::<_, Box<dyn std::error::Error>>((bytes, answer.tokens_used()))
    }))
    .await;
    let mut used = 0;
    for result in streamed {
        let (bytes, tokens) = result?;
        if bytes == 0 || tokens != Some(32) {
            return Err(format!("a stream read {bytes} bytes and reported {tokens:?} tokens").into());
        }
        used += 32;
    }
    let left = llm.status().await?.budgets.tokens.map_or(0, |(left, _)| left);
    println!(
        "call_stream: 6 streams read, at most {} open at the provider at once (limit 2); {used} tokens used of 3,000 \
         reserved, {left} of 10,000 left",
        provider.max_open()
    );
    if provider.max_open() > 2 || left < 10_000 - used || left > 10_000 - used + 10 {
        return Err("the limit or the tokens budget did not hold".into());
    }

    // 2. The reqwest middleware: an event stream's body holds the permit until it is read.
    let client = ClientBuilder::new(reqwest::Client::new())
        .with(WavegateMiddleware::new().host("127.0.0.1", llm.clone()))
        .build();
    let read = join_all((0..6).map(|_| async {
        let mut response = client.get(&url).send().await?;
        let mut bytes = 0;
        while let Some(chunk) = response.chunk().await? {
            bytes += chunk.len();
        }
        Ok::<_, Box<dyn std::error::Error>>(bytes)
    }))
    .await;
    let read: Vec<usize> = read.into_iter().collect::<Result<_, _>>()?;
    println!(
        "middleware: {} streams read, at most {} open at the provider at once (limit 2), {} completed",
        read.len(),
        provider.max_open(),
        provider.completed()
    );
    if provider.max_open() > 2 || provider.completed() != 12 {
        return Err("the middleware's streams were not held".into());
    }
    Ok(())
}
