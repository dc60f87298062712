//! Input and output tokens budgets (Anthropic's ITPM and OTPM) through the public API, against
//! a provider that counts them as Anthropic does (`wavegate_testkit::AnthropicBucket`: each a
//! bucket full at the start and refilled continuously, a call admitted only if each holds its
//! input and its `max_tokens`, the unused output given back at its end).
//!
//! The loads below ask for more than the provider's buckets hold at once (input and output
//! alike): a fleet that did not reserve each part from its own budget would be refused.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use wavegate::{Budget, ErrorKind, Outcome, Scheduler, Upstream, UpstreamConfig};
use wavegate_testkit::{AnthropicBucket, AnthropicLimits, RedisServer};

mod common;

/// 60,000 input tokens (1,000 a second) and 6,000 output tokens (100 a second) per minute.
const LIMITS: AnthropicLimits =
    AnthropicLimits { requests_per_minute: 10_000, input_tokens_per_minute: 60_000, output_tokens_per_minute: 6_000 };

/// Configured as the docs advise: the provider's rates, bursts a little under its buckets (a
/// minute's worth). With bursts of the whole bucket a call granted at the budget's very edge
/// met a bucket 0.10–0.15 of a token short in 3 runs of 10 (the provider charges a call when
/// it arrives, after the grant: while it was full at the start it refilled nothing, the
/// budget did).
fn claude() -> UpstreamConfig {
    UpstreamConfig::builder("claude")
        .limit(50)
        .input_tokens_per_minute(60_000, 59_000)
        .output_tokens_per_minute(6_000, 5_900)
        .build()
        .expect("config")
}

fn success() -> Outcome {
    Outcome::from_status(200, None, std::time::SystemTime::now())
}

/// One call of `input` tokens asking for up to `max_tokens` and producing `output`: admitted
/// (or refused) by the provider, served for 30 ms, then settled from the usage it reports.
async fn call(upstream: &Upstream, provider: &Mutex<AnthropicBucket>, input: u64, max_tokens: u64, output: u64) {
    let permit = upstream
        .request()
        .tokens(input + max_tokens)
        .output_tokens(max_tokens)
        .acquire()
        .await
        .expect("a permit within the wait bound");
    let (answer, level) = {
        let mut provider = provider.lock().expect("provider");
        let level = provider.level(Instant::now());
        (provider.answer(Instant::now(), input, max_tokens), level)
    };
    let status = answer.status;
    if status != 200 {
        eprintln!("refused {input} in, {max_tokens} out: {level:?}");
        permit.report(Outcome::from_status(status, None, std::time::SystemTime::now()));
        return;
    }
    tokio::time::sleep(Duration::from_millis(30)).await;
    provider.lock().expect("provider").finished(Instant::now(), max_tokens, output);
    permit.report_usage_parts(success(), input, output);
}

/// 40 calls at once, two thirds of them on `first`: 600–2,600 in, `max_tokens` 300, 100–250
/// out. 63,000 input tokens and 12,000 of `max_tokens` against buckets of 60,000 and 6,000.
async fn load(first: &Upstream, second: &Upstream, provider: &Arc<Mutex<AnthropicBucket>>) -> Duration {
    let started = Instant::now();
    let calls = (0..40u64).map(|k| {
        let upstream = if k % 3 == 2 { second.clone() } else { first.clone() };
        let provider = provider.clone();
        async move { call(&upstream, &provider, 600 + (k % 3) * 1_000, 300, 100 + (k % 4) * 50).await }
    });
    futures_util::future::join_all(calls).await;
    started.elapsed()
}

fn check(provider: &Mutex<AnthropicBucket>, took: Duration) {
    let provider = provider.lock().expect("provider");
    assert_eq!(provider.refused(), 0, "the provider refused calls: its buckets were overdrawn");
    assert_eq!(provider.input_charged(), 63_000, "every call served once");
    // The output binds: 7,000 produced, 5,900 at once, then 100 a second (11 s).
    assert!(took >= Duration::from_secs(7), "faster than the output bucket allows: {took:?}");
    assert!(took < Duration::from_secs(30), "far slower than the output bucket allows: {took:?}");
}

#[actix::test]
async fn a_fleet_with_input_and_output_budgets_keeps_within_anthropics_buckets() {
    let redis = RedisServer::start().expect("redis-server");
    let build = || Scheduler::builder().upstream(claude()).redis(redis.url()).build().expect("scheduler");
    let (a, b) = (build(), build());
    let provider = Arc::new(Mutex::new(AnthropicBucket::new(LIMITS)));
    let took = load(&a.upstream("claude").expect("claude"), &b.upstream("claude").expect("claude"), &provider).await;
    check(&provider, took);
    let status = a.upstream("claude").expect("claude").status().await.expect("status");
    assert!(status.budgets.input.is_some() && status.budgets.output.is_some(), "{:?}", status.budgets);
}

#[actix::test]
async fn one_process_keeps_within_anthropics_buckets_in_local_mode() {
    let scheduler = common::isolated().upstream(claude()).build().expect("scheduler");
    let provider = Arc::new(Mutex::new(AnthropicBucket::new(LIMITS)));
    let claude = scheduler.upstream("claude").expect("claude");
    let took = load(&claude, &claude, &provider).await;
    check(&provider, took);
}

#[actix::test]
async fn a_large_prompt_is_served_where_one_tokens_budget_would_refuse_it() {
    // ITPM 50,000 and OTPM 8,000: 10,000 in and 2,000 out. One tokens budget sized to the
    // output refuses it; apart, each part fits its own.
    let one = UpstreamConfig::builder("one").tokens_per_minute(8_000, 8_000).build().expect("config");
    let apart = UpstreamConfig::builder("apart")
        .input_tokens_per_minute(50_000, 50_000)
        .output_tokens_per_minute(8_000, 8_000)
        .build()
        .expect("config");
    let scheduler = common::isolated().upstream(one).upstream(apart).build().expect("scheduler");
    let refused =
        scheduler.upstream("one").expect("one").request().tokens(12_000).acquire().await.expect_err("too big");
    assert_eq!(refused.kind(), ErrorKind::InsufficientCapacity);
    let started = Instant::now();
    let permit = scheduler
        .upstream("apart")
        .expect("apart")
        .request()
        .tokens(12_000)
        .output_tokens(2_000)
        .acquire()
        .await
        .expect("each part fits its own budget");
    assert!(started.elapsed() < Duration::from_millis(100), "{:?}", started.elapsed());
    assert_eq!((permit.reserved_tokens(), permit.reserved_output_tokens()), (12_000, 2_000));
    permit.report_usage_parts(success(), 10_000, 400);
    // An output part larger than the output burst never fits: refused at once, saying which.
    let error = scheduler
        .upstream("apart")
        .expect("apart")
        .request()
        .tokens(10_000)
        .output_tokens(8_001)
        .acquire()
        .await
        .expect_err("above the output burst");
    assert_eq!(error.kind(), ErrorKind::InsufficientCapacity);
    assert_eq!(error.budget(), Some(Budget::OutputTokensPerMinute), "{error}");
}

#[actix::test]
async fn the_output_given_back_at_settlement_is_spendable_at_once() {
    // 100 output tokens a second, 200 at once.
    let config = UpstreamConfig::builder("claude").output_tokens_per_minute(6_000, 200).build().expect("config");
    let scheduler = common::isolated().upstream(config).build().expect("scheduler");
    let claude = scheduler.upstream("claude").expect("claude");
    let ask = || claude.request().tokens(1_100).output_tokens(100).acquire();
    let (first, second) = (ask().await.expect("first"), ask().await.expect("second"));
    // The output is spent: the third waits about a second...
    let third = tokio::time::timeout(Duration::from_millis(300), ask()).await;
    assert!(third.is_err(), "the output budget was not spent by two calls of 100");
    // ... until the first says it produced 10 of its 100: 90 come back at once.
    first.report_usage_parts(success(), 1_000, 10);
    let started = Instant::now();
    ask().await.expect("third").succeeded();
    assert!(started.elapsed() < Duration::from_millis(150), "the refund must make room: {:?}", started.elapsed());
    // A usage known only in all settles its excess on the output: 1,000 in were reserved, so
    // 1,300 used means 300 out, 200 more than reserved: the fourth waits almost 3 s.
    second.report_usage(success(), 1_300);
    let started = Instant::now();
    ask().await.expect("fourth").succeeded();
    assert!(
        started.elapsed() >= Duration::from_millis(1_500),
        "the excess went to the output: {:?}",
        started.elapsed()
    );
}

#[actix::test]
async fn output_given_back_in_another_process_is_seen_within_half_a_second() {
    // 10 output tokens a second, 200 at once: a refusal for 100 more says 10 s.
    let config = UpstreamConfig::builder("claude").output_tokens_per_minute(600, 200).build().expect("config");
    let redis = RedisServer::start().expect("redis-server");
    let build = || Scheduler::builder().upstream(config.clone()).redis(redis.url()).build().expect("scheduler");
    let (a, b) = (build(), build());
    let holder = a.upstream("claude").expect("claude").request().tokens(200).output_tokens(200).acquire().await;
    let holder = holder.expect("the whole output burst");
    let claude = b.upstream("claude").expect("claude");
    let asked = Instant::now();
    let waiter = actix::spawn(async move { claude.request().tokens(100).output_tokens(100).acquire().await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    // The call in the other process produced nothing: all 200 come back.
    let given_back = Instant::now();
    holder.report_usage_parts(success(), 0, 0);
    let permit = waiter.await.expect("the task").expect("granted once the output came back");
    let after = given_back.elapsed();
    assert!(after < Duration::from_millis(900), "seen {after:?} after the refund ({:?} after asking)", asked.elapsed());
    permit.succeeded();
}

#[actix::test]
async fn a_refusal_by_the_output_budget_refuses_no_one_early_who_asks_for_input_only() {
    // 10 output tokens a second (200 at once), input plenty. The output is spent and nothing
    // runs: an ask of 100 output tokens cannot come for 10 s, and is told so at once; an ask of
    // as many tokens, all input, has room and must not be refused on that denial's word.
    let config = UpstreamConfig::builder("claude")
        .input_tokens_per_minute(60_000, 10_000)
        .output_tokens_per_minute(600, 200)
        .build()
        .expect("config");
    let redis = RedisServer::start().expect("redis-server");
    let scheduler = Scheduler::builder().upstream(config).redis(redis.url()).build().expect("scheduler");
    let claude = scheduler.upstream("claude").expect("claude");
    let spent = claude.request().tokens(200).output_tokens(200).acquire().await.expect("the output burst");
    spent.report_usage_parts(success(), 0, 200);
    let asked = Instant::now();
    let hopeless = claude.request().tokens(300).output_tokens(100).timeout(Duration::from_secs(3)).acquire().await;
    let refused = hopeless.expect_err("10 s of output to wait for, 3 s allowed");
    assert!(asked.elapsed() < Duration::from_secs(1), "told at once: {:?} ({refused})", asked.elapsed());
    let asked = Instant::now();
    let input_only = claude.request().tokens(300).timeout(Duration::from_secs(1)).acquire().await;
    input_only.expect("input only: room now").succeeded();
    assert!(asked.elapsed() < Duration::from_millis(200), "{:?}", asked.elapsed());
}

/// The outcome of `answer` as the provider sent it: its status and its headers.
fn answered(answer: &wavegate_testkit::Answer) -> Outcome {
    let headers = answer.headers.iter().map(|(name, value)| (name.as_str(), value.as_bytes()));
    let signals = wavegate::ProviderSignals::from_headers(headers, std::time::SystemTime::now());
    Outcome::from_signals(answer.status, None, signals)
}

#[actix::test]
async fn anthropics_output_limit_is_learned_apart_from_its_input_limit() {
    // Nothing configured: what wavegate knows of the provider it learns from the headers. The
    // output bucket (12,000) holds 12 calls of 1,000 `max_tokens`; the input bucket (600,000)
    // holds them all. One tokens budget of both limits together (612,000) would have let all
    // 16 calls through at once.
    let limits = AnthropicLimits {
        requests_per_minute: 10_000,
        input_tokens_per_minute: 600_000,
        output_tokens_per_minute: 12_000,
    };
    let provider = Arc::new(Mutex::new(AnthropicBucket::new(limits)));
    let config = UpstreamConfig::builder("claude").limit(50).build().expect("config");
    let scheduler = common::isolated().upstream(config).build().expect("scheduler");
    let claude = scheduler.upstream("claude").expect("claude");
    let ask = |claude: Upstream, provider: Arc<Mutex<AnthropicBucket>>| async move {
        let permit = claude
            .request()
            .tokens(1_100)
            .output_tokens(1_000)
            .timeout(Duration::from_millis(300))
            .acquire()
            .await
            .ok()?;
        let answer = provider.lock().expect("provider").answer(Instant::now(), 100, 1_000);
        let status = answer.status;
        permit.report_usage_parts(answered(&answer), 100, 1_000);
        Some(status)
    };
    // One call first: its answer tells the limits (and that it took 1,000 of the output).
    assert_eq!(ask(claude.clone(), provider.clone()).await, Some(200));
    let learned = claude.status().await.expect("status").learned;
    assert_eq!(learned.input.map(|l| l.limit.limit), Some(600_000), "{learned:?}");
    assert_eq!(learned.output.map(|l| l.limit.limit), Some(12_000), "{learned:?}");
    // 16 at once, each ready to wait 300 ms (the output refills 60 in that time).
    let answers = futures_util::future::join_all((0..16).map(|_| ask(claude.clone(), provider.clone()))).await;
    let sent = answers.iter().flatten().count();
    let refused_by_provider = answers.iter().flatten().filter(|status| **status != 200).count();
    println!("{sent} sent of 16, {refused_by_provider} refused by the provider");
    assert!(sent <= 12, "{sent} calls of 1,000 max_tokens sent against an output limit of 12,000 (11 left)");
    assert!(refused_by_provider <= 1, "{refused_by_provider} refused by the provider");
}
