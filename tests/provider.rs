//! Listening to the provider, against a mock provider that announces its windows in headers
//! (`wavegate_testkit::MockProvider`): a spent window holds the fleet until its reset (shared
//! through Redis between two schedulers, as two processes would), no concurrency is cut for a
//! rate window, and a spent quota costs one attempt per process, then refuses at once until an
//! operator resets it. The mock counts what really arrives.

use std::time::{Duration, Instant, SystemTime};

use futures_util::future::join_all;
use wavegate::{Error, Outcome, ProviderSignals, RateLimitKind, Scheduler, UpstreamConfig, WaveState};
#[cfg(feature = "redis")]
use wavegate_testkit::RedisServer;
use wavegate_testkit::{HeaderStyle, HttpReply, MockProvider, ProviderLimits, error_code, http_get};

const TIMEOUT: Duration = Duration::from_secs(5);

/// What the provider's answer means: its status, its headers and its body's error code.
fn classify(result: &Result<HttpReply, std::io::Error>) -> Outcome {
    match result {
        Ok(reply) => {
            let headers = reply.headers.iter().map(|(name, value)| (name.as_str(), value.as_bytes()));
            let signals = ProviderSignals::from_headers(headers, SystemTime::now());
            Outcome::from_signals(reply.status, error_code(&reply.body), signals)
        }
        Err(_) => Outcome::from_transport(wavegate::TransportError::Connect),
    }
}

async fn call(s: &Scheduler, provider: &MockProvider, tokens: u64) -> Result<HttpReply, Error<std::io::Error>> {
    let addr = provider.addr();
    let path = format!("/v1/chat?tokens={tokens}");
    s.upstream("llm")
        .expect("configured")
        .request()
        .tokens(tokens)
        .classify(classify)
        .call(|_| http_get(addr, &path, TIMEOUT))
        .await
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
    let s = Scheduler::builder().upstream(upstream(3)).build().expect("scheduler");
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
    let status = s.status("llm").await.expect("status");
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
    let key = wavegate::StoreConfig::new(redis.url())
        .keyspace
        .upstream(&wavegate::core::UpstreamName::new("llm").expect("name"))
        .wave;
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
    let s = Scheduler::builder().upstream(upstream(1)).build().expect("scheduler");
    // 20 callers at once, one permit: the first attempt meets the spent quota, nobody retries.
    let results = join_all((0..20).map(|_| call(&s, &provider, 0))).await;
    assert_eq!(provider.rate_limited(), 1, "one attempt in all, not a retry storm");
    let mut attempts = 0;
    for result in results {
        match result {
            Err(Error::QuotaExhausted { attempts: made, retry_after, .. }) => {
                attempts += made;
                assert!(retry_after > Duration::from_secs(590), "{retry_after:?}");
            }
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(attempts, 1);
    // Refused at once, without a call, and visible in the status.
    let refused_at = Instant::now();
    assert!(matches!(call(&s, &provider, 0).await, Err(Error::QuotaExhausted { attempts: 0, .. })));
    assert!(refused_at.elapsed() < Duration::from_millis(50));
    assert_eq!(provider.rate_limited(), 1);
    let status = s.status("llm").await.expect("status");
    assert!(status.quota_exhausted_for.is_some_and(|left| left > Duration::from_secs(590)));
    // The bill is paid and an operator resets it: calls go through again.
    quota.quota_exhausted = false;
    provider.set_limits(quota);
    assert_eq!(s.reset_quota("llm"), Ok(true));
    assert_eq!(s.status("llm").await.expect("status").quota_exhausted_for, None);
    call(&s, &provider, 0).await.expect("served after the reset");
    assert_eq!(provider.served(), 1);
    assert!(s.reset_quota("nope").is_err());
}

#[actix::test]
async fn a_rate_limit_worded_as_a_quota_with_a_spent_window_is_a_rate_window() {
    // LibreChat #357: a per-minute limit reported as `insufficient_quota`. Its headers name a
    // spent window with a reset, so it pauses instead of refusing the upstream.
    let headers = [("x-ratelimit-remaining-requests", "0"), ("x-ratelimit-reset-requests", "150ms")];
    let signals = ProviderSignals::from_headers(headers.iter().map(|(n, v)| (*n, v.as_bytes())), SystemTime::now());
    let outcome = Outcome::from_signals(429, Some("insufficient_quota"), signals);
    assert_eq!(outcome.rate_limit_kind(), Some(RateLimitKind::RateWindow));
    let s = Scheduler::builder().upstream(upstream(2)).build().expect("scheduler");
    let made = std::cell::Cell::new(0);
    let started = Instant::now();
    let result: Result<(), Error<Outcome>> = s
        .upstream("llm")
        .expect("configured")
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
    assert_eq!(s.status("llm").await.expect("status").quota_exhausted_for, None);
}
