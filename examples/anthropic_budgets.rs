//! Input and output tokens budgets against a provider that counts them apart, as Anthropic
//! does (ITPM and OTPM, each a bucket full at the start and refilled continuously; a call is
//! admitted only if each holds its part: its prompt, its `max_tokens`).
//!
//! Run it: `cargo run --example anthropic_budgets` (local mode, no Redis, a few seconds). The
//! provider is `wavegate_testkit::AnthropicBucket`, in process, with ITPM 30,000 and OTPM 6,000;
//! 24 calls ask at once, each 500–1,500 tokens in and `max_tokens` 500, producing 100–250.
//! Two configurations run one after the other:
//!
//! * `one tokens budget`: `tokens_per_minute(36_000, 36_000)`, the two limits added up, as one
//!   budget must: 12,000 of `max_tokens` go out against an output bucket of 6,000, and the
//!   provider refuses;
//! * `input and output apart`: `input_tokens_per_minute(30_000, 29_400)` and
//!   `output_tokens_per_minute(6_000, 5_880)` (bursts 98 % of the buckets, as the guide advises),
//!   each call's `max_tokens` its output part, settled from the usage: no refusal.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use wavegate::{Outcome, Scheduler, Upstream, UpstreamConfig};
use wavegate_testkit::{AnthropicBucket, AnthropicLimits};

const LIMITS: AnthropicLimits =
    AnthropicLimits { requests_per_minute: 1_000, input_tokens_per_minute: 30_000, output_tokens_per_minute: 6_000 };

/// One call: a permit, the provider's answer, 50 ms of generation, the usage settled.
async fn call(upstream: &Upstream, provider: &Mutex<AnthropicBucket>, k: u64) -> bool {
    let (input, max_tokens, output) = (500 + (k % 3) * 500, 500, 100 + (k % 4) * 50);
    let permit = upstream
        .request()
        .tokens(input + max_tokens)
        .output_tokens(max_tokens)
        .acquire()
        .await
        .expect("a permit within the wait bound");
    let status = provider.lock().expect("provider").answer(Instant::now(), input, max_tokens).status;
    if status != 200 {
        permit.report(Outcome::from_status(status, None, SystemTime::now()));
        return false;
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    provider.lock().expect("provider").finished(Instant::now(), max_tokens, output);
    permit.report_usage_parts(Outcome::success(200), input, output);
    true
}

async fn run(name: &str, config: UpstreamConfig) -> (u64, Duration) {
    let scheduler = Scheduler::builder().upstream(config).build().expect("scheduler");
    let upstream = scheduler.upstream(name).expect("configured");
    let provider = Arc::new(Mutex::new(AnthropicBucket::new(LIMITS)));
    let started = Instant::now();
    let calls = (0..24).map(|k| {
        let (upstream, provider) = (upstream.clone(), provider.clone());
        async move { call(&upstream, &provider, k).await }
    });
    futures_util::future::join_all(calls).await;
    let refused = provider.lock().expect("provider").refused();
    (refused, started.elapsed())
}

#[actix::main]
pub(crate) async fn main() -> Result<(), String> {
    let one = UpstreamConfig::builder("one").limit(32).tokens_per_minute(36_000, 36_000).build();
    let apart = UpstreamConfig::builder("apart")
        .limit(32)
        .input_tokens_per_minute(30_000, 29_400)
        .output_tokens_per_minute(6_000, 5_880)
        .build();
    println!("| configuration | 429s from the provider | took |\n|---|---:|---:|");
    let (refused_one, took) = run("one", one.map_err(|e| e.to_string())?).await;
    println!("| one tokens budget | {refused_one} | {:.1} s |", took.as_secs_f64());
    let (refused_apart, took) = run("apart", apart.map_err(|e| e.to_string())?).await;
    println!("| input and output apart | {refused_apart} | {:.1} s |", took.as_secs_f64());
    if refused_apart > 0 || refused_one == 0 {
        return Err(format!("expected refusals with one budget only: {refused_one} and {refused_apart}"));
    }
    Ok(())
}
