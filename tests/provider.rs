//! Listening to the provider, against a mock provider that announces its windows in headers
//! (`wavegate_testkit::MockProvider`): a spent window holds the fleet until its reset (shared
//! through Redis between two schedulers, as two processes would), no concurrency is cut for a
//! rate window, and a spent quota costs one attempt per process, then refuses at once until an
//! operator resets it. The mock counts what really arrives.

use std::time::{Duration, Instant, SystemTime};

use futures_util::future::join_all;
use wavegate::{Error, ErrorKind, Outcome, ProviderSignals, RateLimitKind, Scheduler, UpstreamConfig, WaveState};
#[cfg(feature = "redis")]
use wavegate_testkit::RedisServer;
use wavegate_testkit::{HeaderStyle, HttpReply, MockProvider, ProviderLimits, http_get};

mod common;
use common::classify;

const TIMEOUT: Duration = Duration::from_secs(5);

async fn call(s: &Scheduler, provider: &MockProvider, tokens: u64) -> Result<HttpReply, Error<std::io::Error>> {
    let llm = s.upstream("llm").expect("configured");
    let addr = provider.addr();
    let path = format!("/v1/chat?tokens={tokens}");
    llm.request().tokens(tokens).classify(classify).call(|_| http_get(addr, &path, TIMEOUT)).await
}

fn limits(style: HeaderStyle, requests: u64, window: Duration) -> ProviderLimits {
    ProviderLimits { style, requests: Some(requests), tokens: None, window, quota_exhausted: false }
}

fn upstream(limit: u32) -> UpstreamConfig {
    UpstreamConfig::builder("llm")
        .limit(limit)
        .max_wait(Duration::from_secs(10))
        .quota_pause(Duration::from_secs(600))
        .build()
        .expect("valid")
}

#[actix::test]
async fn a_spent_window_holds_the_calls_until_its_reset_without_a_cut() {
    // 6 calls per 400 ms window; 3 callers; nothing configured but the concurrency limit.
    let window = Duration::from_millis(400);
    let provider = MockProvider::start(limits(HeaderStyle::OpenAi, 6, window), Duration::from_millis(5)).unwrap();
    let s = common::isolated().upstream(upstream(3)).build().expect("scheduler");
    let llm = s.upstream("llm").expect("configured");
    let started = Instant::now();
    let callers = (0..3).map(|_| async {
        for _ in 0..10 {
            call(&s, &provider, 0).await.expect("every call succeeds");
        }
    });
    join_all(callers).await;
    let elapsed = started.elapsed();
    // 30 calls at 6 per window take at least 5 windows: the fleet really waited for resets.
    assert!(elapsed >= window * 4, "{elapsed:?}: the windows were not respected");
    // A call granted right at a window's edge may meet the old window (the reset is sent in
    // whole milliseconds): at most one per window. Without listening, every window past its
    // 6th call would draw 429s.
    let windows = (elapsed.as_millis() / window.as_millis() + 1) as u64;
    assert!(provider.rate_limited() <= windows, "{} 429s in {windows} windows", provider.rate_limited());
    assert_eq!(provider.served(), 30);
    let status = llm.status().await.expect("status");
    assert_eq!((status.state, status.limit, status.wave), (WaveState::Normal, 3, 1), "a rate window cuts nothing");
}

#[cfg(feature = "redis")]
#[actix::test]
async fn zero_left_until_the_reset_holds_the_whole_fleet_through_redis() {
    let redis = RedisServer::start().expect("redis-server");
    let build = || Scheduler::builder().upstream(upstream(10)).redis(redis.url()).build().expect("scheduler");
    let (a, b) = (build(), build());
    // Anthropic's resets are whole seconds (rounded up): one call per 1 s window.
    let window = Duration::from_secs(1);
    let provider = MockProvider::start(limits(HeaderStyle::Anthropic, 1, window), Duration::from_millis(5)).unwrap();
    call(&a, &provider, 0).await.expect("the first call");
    // A's answer said "0 left until the reset". A's coordinator sends it to the store after
    // the answer (one script call): wait until it is there, then B, another process, must wait
    // for the reset too.
    let answered = Instant::now();
    let mut con = redis.connection().expect("connection");
    let key = common::wave_key(&redis, "llm");
    loop {
        let until: Option<u64> = redis::cmd("HGET").arg(&key).arg("pw_requests_until").query(&mut con).expect("HGET");
        if until.is_some() {
            break;
        }
        assert!(answered.elapsed() < Duration::from_millis(500), "A's window report never reached the store");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    call(&b, &provider, 0).await.expect("B's call, after the reset");
    assert_eq!(provider.rate_limited(), 0, "B did not meet the spent window");
    let calls = provider.calls();
    assert_eq!(calls.len(), 2);
    assert!(calls[1].0.duration_since(calls[0].0) >= window, "B was sent before the window reset");
    assert!(answered.elapsed() < window * 3, "B waited far longer than the reset");
}

#[actix::test]
async fn a_spent_quota_costs_one_attempt_per_process_then_refuses_at_once_until_reset() {
    let mut quota = limits(HeaderStyle::OpenAi, 1_000, Duration::from_secs(60));
    quota.quota_exhausted = true;
    let provider = MockProvider::start(quota, Duration::from_millis(5)).unwrap();
    let s = common::isolated().upstream(upstream(1)).build().expect("scheduler");
    // 20 callers at once, one permit: the first attempt meets the spent quota, nobody retries.
    let results = join_all((0..20).map(|_| call(&s, &provider, 0))).await;
    assert_eq!(provider.rate_limited(), 1, "one attempt in all, not a retry storm");
    let mut attempts = 0;
    for result in results {
        match result {
            Err(error) if error.kind() == ErrorKind::QuotaExhausted => {
                attempts += error.attempts().expect("counted");
                let retry_after = error.retry_after().expect("refused until a reset");
                assert!(retry_after > Duration::from_secs(590), "{retry_after:?}");
            }
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(attempts, 1);
    // Refused at once, without a call, and visible in the status.
    let refused_at = Instant::now();
    let refused = call(&s, &provider, 0).await.expect_err("refused at once");
    assert_eq!((refused.kind(), refused.attempts()), (ErrorKind::QuotaExhausted, Some(0)), "{refused:?}");
    assert!(refused_at.elapsed() < Duration::from_millis(50));
    assert_eq!(provider.rate_limited(), 1);
    let llm = s.upstream("llm").expect("configured");
    let status = llm.status().await.expect("status");
    assert!(status.quota_exhausted_for.is_some_and(|left| left > Duration::from_secs(590)));
    // The bill is paid and an operator resets it: calls go through again.
    quota.quota_exhausted = false;
    provider.set_limits(quota);
    assert!(llm.reset_quota(), "there was a refusal to lift");
    assert!(!llm.reset_quota(), "it is lifted already");
    assert_eq!(llm.status().await.expect("status").quota_exhausted_for, None);
    call(&s, &provider, 0).await.expect("served after the reset");
    assert_eq!(provider.served(), 1);
}

#[actix::test]
async fn a_rate_limit_worded_as_a_quota_with_a_spent_window_is_a_rate_window() {
    // LibreChat #357: a per-minute limit reported as `insufficient_quota`. Its headers name a
    // spent window with a reset, so it pauses instead of refusing the upstream.
    let headers = [("x-ratelimit-remaining-requests", "0"), ("x-ratelimit-reset-requests", "150ms")];
    let signals = ProviderSignals::from_headers(headers.iter().map(|(n, v)| (*n, v.as_bytes())), SystemTime::now());
    let outcome = Outcome::from_signals(429, Some("insufficient_quota"), signals);
    assert_eq!(outcome.rate_limit_kind(), Some(RateLimitKind::RateWindow));
    let s = common::isolated().upstream(upstream(2)).build().expect("scheduler");
    let llm = s.upstream("llm").expect("configured");
    let made = std::cell::Cell::new(0);
    let started = Instant::now();
    let result: Result<(), Error<Outcome>> = llm
        .request()
        .call(|_| {
            made.set(made.get() + 1);
            let answer = if made.get() == 1 { Err(outcome) } else { Ok(()) };
            async move { answer }
        })
        .await;
    result.expect("retried after the window's reset");
    assert_eq!(made.get(), 2);
    assert!(started.elapsed() >= Duration::from_millis(150), "retried before the reset");
    assert_eq!(llm.status().await.expect("status").quota_exhausted_for, None);
}

#[actix::test]
async fn a_large_prompt_within_anthropics_input_limit_is_served_not_refused() {
    // Anthropic: ITPM 50,000 and OTPM 8,000, said on every answer. A 10,000-in / 2,000-out
    // call is within both; learning the output limit alone would refuse its 12,000 estimate.
    let later = |secs: u64| wavegate_testkit::rfc3339_ceil(SystemTime::now() + Duration::from_secs(secs));
    let headers = [
        ("anthropic-ratelimit-input-tokens-limit", "50000".to_owned()),
        ("anthropic-ratelimit-input-tokens-remaining", "48000".to_owned()),
        ("anthropic-ratelimit-input-tokens-reset", later(2)),
        ("anthropic-ratelimit-output-tokens-limit", "8000".to_owned()),
        ("anthropic-ratelimit-output-tokens-remaining", "7600".to_owned()),
        ("anthropic-ratelimit-output-tokens-reset", later(3)),
    ];
    let signals = ProviderSignals::from_headers(headers.iter().map(|(n, v)| (*n, v.as_bytes())), SystemTime::now());
    let s = common::isolated().upstream(upstream(4)).build().expect("scheduler");
    let llm = s.upstream("llm").expect("configured");
    let permit = llm.request().tokens(2_400).acquire().await.expect("a first call");
    permit.report_usage(Outcome::from_signals(200, None, signals), 2_400);
    let learned = llm.status().await.expect("status").learned;
    assert_eq!(learned.tokens.map(|l| l.limit.limit), Some(58_000), "{learned:?}");
    let started = Instant::now();
    let big = llm.request().tokens(12_000).acquire().await.expect("a 12,000-token estimate is admitted");
    assert!(started.elapsed() < Duration::from_millis(500), "held back {:?}: both windows had room", started.elapsed());
    big.report_usage(Outcome::success(200), 12_000);
}

/// A configured requests budget (`rpm` a minute, bursts of `burst`), nothing else but the limit.
fn budgeted(limit: u32, rpm: u32, burst: u32) -> UpstreamConfig {
    UpstreamConfig::builder("llm")
        .limit(limit)
        .requests_per_minute(rpm, burst)
        .max_wait(Duration::from_secs(10))
        .build()
        .expect("valid")
}

/// The most calls the provider served in any span of `span`, from `skip` after its first call.
fn densest(provider: &MockProvider, span: Duration, skip: Duration) -> usize {
    let calls = provider.calls();
    let Some(first) = calls.first().map(|(at, _)| *at) else { return 0 };
    let served: Vec<Instant> =
        calls.into_iter().filter(|(at, s)| *s == 200 && *at >= first + skip).map(|(at, _)| at).collect();
    (0..served.len())
        .map(|i| served[i..].iter().take_while(|at| at.duration_since(served[i]) < span).count())
        .max()
        .unwrap_or(0)
}

/// Keeps `callers` callers of each scheduler busy for `run`.
async fn flood(schedulers: &[Scheduler], provider: &MockProvider, callers: usize, run: Duration) {
    let started = Instant::now();
    let all = schedulers.iter().flat_map(|s| (0..callers).map(move |_| s)).map(|s| async move {
        while started.elapsed() < run {
            call(s, provider, 0).await.expect("every call succeeds");
        }
    });
    join_all(all).await;
}

#[cfg(feature = "redis")]
#[actix::test]
async fn an_announced_limit_tighter_than_the_configured_budget_holds_the_fleet_to_it() {
    // Configured 1,000 a minute (bursts of 5); the provider announces 10 per 2 s window
    // (IETF `RateLimit-Policy: q=10;w=2`: 300 a minute). Four schedulers on one Redis.
    let redis = RedisServer::start().expect("redis-server");
    let fleet: Vec<Scheduler> = (0..4)
        .map(|_| Scheduler::builder().upstream(budgeted(20, 1_000, 5)).redis(redis.url()).build().expect("scheduler"))
        .collect();
    let window = Duration::from_secs(2);
    let provider = MockProvider::start(limits(HeaderStyle::Ietf, 10, window), Duration::from_millis(5)).unwrap();
    let run = Duration::from_secs(8);
    let started = Instant::now();
    flood(&fleet, &provider, 3, run).await;
    let elapsed = started.elapsed();
    let (served, refused) = (provider.served(), provider.rate_limited());
    // The learned budget: 5 a second, bursts of 5. Spread like that, once learned (after the
    // first window: its first calls went out at the configured rate), no 500 ms holds more
    // than 5 + 2.5 (one more for the edges); at the configured 1,000 a minute each window's
    // 10 calls went out within 300 ms (the test then fails).
    let densest = densest(&provider, Duration::from_millis(500), window);
    let allowed = 5.0 + 300.0 / 60.0 * elapsed.as_secs_f64();
    eprintln!(
        "learned 300/min under configured 1000/min: {served} served, {refused} 429s in {elapsed:?} ({:.0}/min, \
         {:.0} % of the learned budget's {allowed:.0}); densest 500 ms: {densest}",
        served as f64 * 60.0 / elapsed.as_secs_f64(),
        served as f64 * 100.0 / allowed
    );
    assert!(refused <= 1, "{refused} 429s");
    assert!(densest <= 8, "{densest} calls in 500 ms: the configured budget, not the learned one");
    assert!(served as f64 <= allowed + 1.0, "{served} served, the learned budget allows {allowed:.0}");
    // Below the budget: the window tracking pauses each spent window until its reset, and
    // the IETF `t=` is in whole seconds (rounded up), each answer moving the known end a bit
    // later (measured: 10 calls per ~2.9 s instead of per 2 s window; see docs/guide.md).
    assert!(served as f64 >= allowed * 0.6, "{served} served: the learned budget allows {allowed:.0}");
    // The status shows the learned limit, and the budget in force.
    let status = fleet[1].upstream("llm").expect("configured").status().await.expect("status");
    let learned = status.learned.requests.expect("a learned requests limit");
    assert_eq!((learned.limit.limit, learned.limit.window_ms), (10, 2_000));
    assert!(learned.forgotten_in > Duration::from_secs(4) && learned.forgotten_in <= Duration::from_secs(6));
    assert!(status.budgets.requests.is_some_and(|(remaining, _)| remaining <= 5), "{:?}", status.budgets);
}

#[actix::test]
async fn an_announced_limit_looser_than_the_configured_budget_never_loosens_it() {
    // Configured 100 a minute (bursts of 2); the provider announces 300 a minute.
    let s = common::isolated().upstream(budgeted(4, 100, 2)).build().expect("scheduler");
    let llm = s.upstream("llm").expect("configured");
    let window = Duration::from_secs(2);
    let provider = MockProvider::start(limits(HeaderStyle::Ietf, 10, window), Duration::from_millis(5)).unwrap();
    let run = Duration::from_secs(6);
    let started = Instant::now();
    flood(std::slice::from_ref(&s), &provider, 3, run).await;
    let elapsed = started.elapsed();
    let served = provider.served();
    // The last call may start up to one interval (600 ms) before the run ends.
    let allowed = 2.0 + 100.0 / 60.0 * elapsed.as_secs_f64();
    eprintln!(
        "learned 300/min over configured 100/min: {served} served, {} 429s in {elapsed:?} ({:.0}/min)",
        provider.rate_limited(),
        served as f64 * 60.0 / elapsed.as_secs_f64()
    );
    assert_eq!(provider.rate_limited(), 0);
    assert!(served as f64 <= allowed + 1.0, "{served} served: the configured budget allows {allowed:.0}");
    assert!(served as f64 >= allowed - 3.0, "{served} served: the configured budget allows {allowed:.0}");
    let status = llm.status().await.expect("status");
    assert_eq!(status.learned.requests.map(|l| l.limit.limit), Some(10), "learned, and shown");
}

#[actix::test]
async fn without_a_configured_budget_an_announced_limit_is_the_budget() {
    // Nothing configured but the concurrency limit; the provider announces 6 per 2 s window.
    let s = common::isolated().upstream(upstream(6)).build().expect("scheduler");
    let llm = s.upstream("llm").expect("configured");
    let provider =
        MockProvider::start(limits(HeaderStyle::Ietf, 6, Duration::from_secs(2)), Duration::from_millis(5)).unwrap();
    flood(std::slice::from_ref(&s), &provider, 6, Duration::from_secs(5)).await;
    // 3 a second with bursts of 6. Without the learned budget there is no requests budget at
    // all (only the window tracking holds each window's calls back).
    let densest = densest(&provider, Duration::from_millis(1_000), Duration::ZERO);
    eprintln!(
        "learned 180/min, none configured: {} served, {} 429s, densest second {densest}",
        provider.served(),
        provider.rate_limited()
    );
    assert!(provider.rate_limited() <= 1);
    let status = llm.status().await.expect("status");
    assert!(status.budgets.requests.is_some(), "a learned limit is a budget");
}

#[cfg(feature = "redis")]
#[actix::test]
async fn a_fallback_goes_on_with_the_learned_limits() {
    let mut redis = RedisServer::start().expect("redis-server");
    let s = Scheduler::builder().upstream(upstream(6)).redis(redis.url()).build().expect("scheduler");
    let llm = s.upstream("llm").expect("configured");
    // 12 per 3 s window: 240 a minute, bursts of 12; nothing configured.
    let provider =
        MockProvider::start(limits(HeaderStyle::Ietf, 12, Duration::from_secs(3)), Duration::from_millis(5)).unwrap();
    call(&s, &provider, 0).await.expect("a call that teaches the limit");
    tokio::time::sleep(Duration::from_millis(150)).await; // the report and a heartbeat land
    let shared = llm.status().await.expect("status");
    assert_eq!(shared.mode, wavegate::Mode::Shared);
    assert_eq!(shared.learned.requests.map(|l| l.limit.limit), Some(12), "kept in the store");
    // The fleet's budget in force, full: the first call was granted before anything was known.
    assert_eq!(shared.budgets.requests.map(|(remaining, _)| remaining), Some(12));

    redis.kill().expect("kill -9");
    call(&s, &provider, 0).await.expect("a call through the fallback");
    let status = llm.status().await.expect("status");
    assert_eq!(status.mode, wavegate::Mode::Fallback);
    assert_eq!(status.learned.requests.map(|l| l.limit.limit), Some(12), "the fallback started knowing it");
    // The only live process: its share is the whole learned budget, charged with the call.
    let (remaining, _) = status.budgets.requests.expect("the learned budget is in force in the fallback");
    assert_eq!(remaining, 11);
}

#[cfg(feature = "redis")]
#[actix::test]
async fn a_process_reset_on_its_own_stays_lifted_when_another_live_change_comes() {
    // A meets a spent quota and tells the fleet; B refuses the upstream too. The bill is
    // paid and B's operator lifts B's refusal (`Upstream::reset_quota`, this process only).
    // An unrelated live change (a limit) must not put the old spent quota back on B.
    let redis = RedisServer::start().expect("redis-server");
    let build = || Scheduler::builder().upstream(upstream(4)).redis(redis.url()).build().expect("scheduler");
    let (a, b) = (build(), build());
    let mut quota = limits(HeaderStyle::OpenAi, 1_000, Duration::from_secs(60));
    quota.quota_exhausted = true;
    let provider = MockProvider::start(quota, Duration::from_millis(5)).unwrap();
    let refused = call(&a, &provider, 0).await.expect_err("the spent quota");
    assert_eq!(refused.kind(), ErrorKind::QuotaExhausted);
    let llm_b = b.upstream("llm").expect("configured");
    let told = Instant::now();
    while llm_b.status().await.expect("status").quota_exhausted_for.is_none() {
        assert!(told.elapsed() < Duration::from_secs(5), "B never heard of the spent quota");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    quota.quota_exhausted = false;
    provider.set_limits(quota);
    assert!(llm_b.reset_quota(), "B was refused");
    call(&b, &provider, 0).await.expect("B is served after its reset");
    // Another live change, applied by every process (B included).
    let version = llm_b.set_limit(3).await.expect("live limit");
    let applied = Instant::now();
    while llm_b.status().await.expect("status").live_version < version {
        assert!(applied.elapsed() < Duration::from_secs(5), "B never applied the limit");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(llm_b.status().await.expect("status").quota_exhausted_for, None, "B's reset was undone");
    call(&b, &provider, 0).await.expect("B is still served");
}

/// A gateway that counts in fixed windows and speaks OpenAI's headers: its reset is the
/// window's end, not the time to a full bucket. Read as the window's end (`Window::refills`),
/// each window is spent at once and the next waited for, with no 429, in a fleet of four.
/// (The stall that reading it as a refill caused with one-minute windows — the scenario
/// provider-headers failed jobs after 5 minutes of waiting — is reproduced without a minute's
/// wait by `wavegate-core`'s `a_fixed_window_told_in_openai_headers_is_spent_then_waited_for_not_trickled`;
/// with 4 s windows the fleet recovered from it at each window.)
#[cfg(feature = "redis")]
#[actix::test]
async fn fixed_windows_told_in_openai_headers_are_spent_window_after_window_without_429s() {
    let redis = RedisServer::start().expect("redis-server");
    // 100 calls of 200 tokens per 4 s window (the tokens bind; 120 requests).
    let window = Duration::from_secs(4);
    let limits = ProviderLimits {
        style: HeaderStyle::OpenAi,
        requests: Some(120),
        tokens: Some(20_000),
        window,
        quota_exhausted: false,
    };
    let provider = MockProvider::start(limits, Duration::from_millis(20)).unwrap();
    let config = UpstreamConfig::builder("llm").limit(10).max_wait(Duration::from_secs(60)).build().expect("valid");
    let fleet: Vec<Scheduler> = (0..4)
        .map(|_| Scheduler::builder().upstream(config.clone()).redis(redis.url()).build().expect("scheduler"))
        .collect();
    let started = Instant::now();
    // 80 callers, 4 calls each: 320 calls, three full windows and a part of a fourth.
    let callers = (0..80).map(|i| {
        let (s, provider) = (&fleet[i % 4], &provider);
        async move {
            for _ in 0..4 {
                call(s, provider, 200).await.expect("every call succeeds");
            }
        }
    });
    join_all(callers).await;
    let elapsed = started.elapsed();
    assert_eq!(provider.served(), 320);
    // The fourth window starts 12 s after the first call; it is spent within a second.
    assert!(elapsed < window * 3 + Duration::from_secs(3), "{elapsed:?}: the fleet stalled between windows");
    // A call at a window's edge may meet the old window: at most a few in all.
    assert!(provider.rate_limited() <= 4, "{} 429s: the windows were read as refills", provider.rate_limited());
}
