//! Cached input reads weighed as the provider counts them (`cache_read_weight`, feature
//! `sse`): an answer's usage names its cached reads (Anthropic's `cache_read_input_tokens`
//! beside the input, OpenAI's `cached_tokens` inside it), and the input budget is settled
//! with the uncached input plus the weight of each read — from a whole answer's body and from
//! a streamed answer's events alike.
//!
//! Run with `cargo test -p wavegate --features sse --test cache_reads` (CI does).

use futures_util::StreamExt;
use wavegate::{Outcome, StreamUsage, Upstream, UpstreamConfig};

mod common;

/// An input budget of one token a second (so the figures stay put), 10,000 at once.
fn upstream(name: &str, weight: Option<f64>) -> UpstreamConfig {
    let builder = UpstreamConfig::builder(name).limit(4).input_tokens_per_minute(60, 10_000);
    match weight {
        Some(weight) => builder.cache_read_weight(weight),
        None => builder,
    }
    .build()
    .expect("config")
}

async fn input_left(upstream: &Upstream) -> u64 {
    upstream.status().await.expect("status").budgets.input.expect("an input budget").0
}

#[actix::test]
async fn a_whole_answers_cache_reads_count_as_the_upstream_says() {
    let scheduler = common::isolated()
        .upstream(upstream("as-reported", None))
        .upstream(upstream("counted", Some(1.0)))
        .upstream(upstream("half", Some(0.5)))
        .build()
        .expect("scheduler");
    // Anthropic's body: 100 new tokens of prompt, 5,000 read from the cache, 40 out.
    let body = r#"{"type":"message","usage":{"input_tokens":100,"cache_read_input_tokens":5000,"output_tokens":40}}"#;
    for (name, charged) in [("as-reported", 100), ("counted", 5_100), ("half", 2_600)] {
        let upstream = scheduler.upstream(name).expect("upstream");
        let permit = upstream.request().tokens(2_000).output_tokens(200).acquire().await.expect("a permit");
        assert!(input_left(&upstream).await <= 8_201, "{name}: 1,800 of input reserved");
        permit.report_stream_usage(Outcome::success(200), StreamUsage::of_body(body).expect("a usage"));
        let left = input_left(&upstream).await;
        assert!(
            (10_000 - charged..=10_000 - charged + 5).contains(&left),
            "{name}: {left} of input left, {charged} expected charged"
        );
    }
}

#[actix::test]
async fn a_streamed_answers_cached_tokens_are_weighed_at_its_end() {
    let scheduler = common::isolated()
        .upstream(upstream("as-reported", None))
        .upstream(upstream("free", Some(0.0)))
        .build()
        .expect("scheduler");
    // OpenAI's last chunk: 6,000 of prompt, 5,000 of them cached, 20 out.
    let events = [
        "data: {\"choices\":[{\"delta\":{\"content\":\"Hi\"}}],\"usage\":null}\n\n",
        "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":6000,\"completion_tokens\":20,\"total_tokens\":6020,",
        "\"prompt_tokens_details\":{\"cached_tokens\":5000}}}\n\ndata: [DONE]\n\n",
    ];
    for (name, charged) in [("as-reported", 6_000), ("free", 1_000)] {
        let upstream = scheduler.upstream(name).expect("upstream");
        let mut answer = upstream
            .request()
            .tokens(7_000)
            .output_tokens(500)
            .meter(wavegate::SseUsage::new())
            .call_stream(
                |_| async { Ok::<_, Outcome>(events) },
                |chunks| futures_util::stream::iter(chunks.into_iter().map(|c| Ok::<_, std::io::Error>(c.as_bytes()))),
            )
            .await
            .expect("a stream");
        while let Some(chunk) = answer.next().await {
            chunk.expect("a chunk");
        }
        let left = input_left(&upstream).await;
        assert!(
            (10_000 - charged..=10_000 - charged + 5).contains(&left),
            "{name}: {left} of input left, {charged} expected charged"
        );
    }
}

#[test]
fn a_weight_outside_zero_to_one_is_refused_at_build_time() {
    for weight in [-0.1, 1.5, f64::NAN] {
        let error = UpstreamConfig::builder("llm").cache_read_weight(weight).build().expect_err("out of range");
        assert!(error.to_string().contains("cache_read_weight"), "{error}");
    }
}
