//! Local mode (no Redis) through the public API only: `Scheduler::upstream`, the request
//! builder's `call` and `acquire`, `Permit`, `Upstream::status` and the typed errors.
//!
//! Every test counts what really happens (closure invocations, calls in flight, elapsed time)
//! so that it fails when the claim in its name is false. Durations are tens or hundreds of
//! milliseconds; the whole file runs in a few seconds.

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use futures_util::future::join_all;
use wavegate::config::{Backoff, BreakerConfig, ConfigError, Recovery, RetryBudgetConfig, UpstreamConfigBuilder};

mod common;
use wavegate::{
    Attempt, BuildError, Error, ErrorKind, Outcome, Permit, Scheduler, UpstreamConfig, UpstreamStatus, WaveState,
};

const MS: Duration = Duration::from_millis(1);

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// A local scheduler with one upstream named `x`.
fn scheduler(config: UpstreamConfigBuilder) -> Scheduler {
    common::isolated().upstream(config.build().expect("valid configuration")).build().expect("scheduler")
}

fn x() -> UpstreamConfigBuilder {
    UpstreamConfig::builder("x")
}

/// `x` with the seed's recovery: every 429 of the current wave stops everyone for a cooldown
/// (the walk-through of DESIGN.md, which these tests check step by step).
fn seed() -> UpstreamConfigBuilder {
    x().recovery(Recovery::Seed)
}

fn status_outcome(code: u16) -> Outcome {
    Outcome::from_status(code, None, SystemTime::now())
}

async fn status(scheduler: &Scheduler) -> UpstreamStatus {
    scheduler.upstream("x").expect("configured").status().await.expect("status")
}

/// Waits (bounded) until `x` has `depth` callers queued, so waiters enter in a known order.
async fn until_queued(scheduler: &Scheduler, depth: usize) {
    let start = Instant::now();
    while status(scheduler).await.queue_depth < depth {
        assert!(start.elapsed() < ms(500), "{depth} waiters never queued");
        tokio::time::sleep(MS).await;
    }
}

/// Runs `future` and tells how long it took.
async fn timed<T>(future: impl Future<Output = T>) -> (T, Duration) {
    let start = Instant::now();
    let value = future.await;
    (value, start.elapsed())
}

/// Sets its flag when dropped: shows that the caller's upstream future was cancelled.
struct SetOnDrop(Arc<AtomicBool>);

impl Drop for SetOnDrop {
    fn drop(&mut self) {
        self.0.store(true, SeqCst);
    }
}

// 1
#[actix::test]
async fn never_more_calls_in_flight_than_the_limit_and_the_limit_is_used() {
    let s = scheduler(x().limit(5));
    let upstream = s.upstream("x").expect("configured");
    let in_flight = Arc::new(AtomicUsize::new(0));
    let max_seen = Arc::new(AtomicUsize::new(0));
    let invoked = Arc::new(AtomicUsize::new(0));
    let calls = (0..200).map(|i| {
        let (upstream, in_flight, max_seen, invoked) =
            (upstream.clone(), in_flight.clone(), max_seen.clone(), invoked.clone());
        async move {
            upstream
                .request()
                .call(move |_| {
                    let (in_flight, max_seen, invoked) = (in_flight.clone(), max_seen.clone(), invoked.clone());
                    async move {
                        invoked.fetch_add(1, SeqCst);
                        let now = in_flight.fetch_add(1, SeqCst) + 1;
                        max_seen.fetch_max(now, SeqCst);
                        tokio::time::sleep(ms(5)).await;
                        in_flight.fetch_sub(1, SeqCst);
                        Ok::<_, Outcome>(i)
                    }
                })
                .await
        }
    });
    let (results, elapsed) = timed(tokio::time::timeout(ms(3_000), join_all(calls))).await;
    let results = results.expect("releases do not wake waiters: still running after 3 s");
    for (i, result) in results.into_iter().enumerate() {
        assert_eq!(result.expect("every call succeeds"), i);
    }
    assert_eq!(invoked.load(SeqCst), 200, "one attempt per call");
    assert_eq!(max_seen.load(SeqCst), 5, "at most the limit in flight, and the limit is used");
    // 200 calls of >= 5 ms, 5 at a time: at least 40 rounds of 5 ms. A release must wake the
    // next waiter at once: waiting for the 250 ms at-limit poll would take seconds.
    assert!(elapsed >= ms(200), "faster than the limit allows: {elapsed:?}");
    assert!(elapsed < ms(2_000), "releases do not wake waiters promptly: {elapsed:?}");
    let st = status(&s).await;
    assert_eq!((st.in_flight_local, st.queue_depth), (0, 0));
}

// 2
#[actix::test]
async fn local_waiters_are_served_first_in_first_out() {
    let s = scheduler(x().limit(1));
    let upstream = s.upstream("x").expect("configured");
    let holder = upstream.request().acquire().await.expect("first permit");
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut waiters = Vec::new();
    for i in 0..8usize {
        let (upstream, order) = (upstream.clone(), order.clone());
        waiters.push(actix::spawn(async move {
            upstream
                .request()
                .call(move |_| {
                    let order = order.clone();
                    async move {
                        order.lock().expect("lock").push(i);
                        Ok::<_, Outcome>(())
                    }
                })
                .await
        }));
        until_queued(&s, i + 1).await;
    }
    assert!(order.lock().expect("lock").is_empty(), "nobody runs while the only permit is held");
    holder.succeeded();
    for waiter in waiters {
        waiter.await.expect("task").expect("call");
    }
    assert_eq!(*order.lock().expect("lock"), (0..8).collect::<Vec<_>>());
}

// 3
#[actix::test]
async fn waiting_longer_than_max_wait_is_refused_in_time() {
    let s = scheduler(x().limit(1).max_wait(ms(100)).total_timeout(ms(2_000)));
    let upstream = s.upstream("x").expect("configured");
    let _held = upstream.request().acquire().await.expect("first permit");

    let (result, elapsed) = timed(upstream.request().acquire()).await;
    let error = result.expect_err("no permit is free");
    assert_eq!(error.kind(), ErrorKind::WaitedTooLong, "{error:?}");
    assert!(error.waited().is_some_and(|waited| waited >= ms(90)), "{error:?}");
    assert!(elapsed >= ms(100) && elapsed < ms(300), "acquire gave up after {elapsed:?}");
    assert!(error.is_overload());
    assert!(error.retry_after().is_some_and(|d| d > Duration::ZERO));
    assert_eq!(error.code(), "waited_too_long");

    // Through `call`: the same wait, and the closure never runs.
    let invoked = Arc::new(AtomicUsize::new(0));
    let counter = invoked.clone();
    let (result, elapsed) = timed(upstream.request().call(move |_| {
        counter.fetch_add(1, SeqCst);
        async { Ok::<_, Outcome>(()) }
    }))
    .await;
    assert_eq!(result.as_ref().map_err(Error::kind).err(), Some(ErrorKind::WaitedTooLong), "{result:?}");
    assert!(elapsed >= ms(100) && elapsed < ms(300), "call gave up after {elapsed:?}");
    assert_eq!(invoked.load(SeqCst), 0);
    assert_eq!(status(&s).await.queue_depth, 0, "the expired waiters left the queue");
}

#[actix::test]
async fn a_caller_whose_deadline_falls_in_a_cooldown_is_refused_at_once_with_when_to_come_back() {
    // The seed recovery: a 429 without Retry-After stops everyone for the ladder's 3 s.
    let s = scheduler(seed().limit(2).cooldown_ladder([Duration::from_secs(3)]).max_wait(Duration::from_secs(10)));
    let upstream = s.upstream("x").expect("configured");
    upstream.request().acquire().await.expect("a permit").report(status_outcome(429));
    // Due in 500 ms, inside the cooldown: told now, not at its deadline.
    let (result, elapsed) = timed(upstream.request().timeout(ms(500)).acquire()).await;
    let error = result.expect_err("no permit can come in time");
    assert_eq!(error.kind(), ErrorKind::DeadlinePassed, "{error}");
    let needed = error.retry_after().expect("when to come back");
    assert!(needed > ms(2_500) && needed <= ms(3_000), "told to come back in {needed:?}");
    assert!(elapsed < ms(10), "refused after {elapsed:?}");
    // And one asked for while the lane knows the cooldown: at admission.
    let (result, elapsed) = timed(upstream.request().timeout(ms(500)).acquire()).await;
    assert_eq!(result.expect_err("refused").kind(), ErrorKind::DeadlinePassed);
    assert!(elapsed < ms(10), "refused after {elapsed:?}");
    // A caller who can wait past the cooldown waits and is served.
    let (result, elapsed) = timed(upstream.request().timeout(ms(4_000)).acquire()).await;
    result.expect("served after the cooldown").succeeded();
    assert!(elapsed >= ms(2_400), "served after {elapsed:?}, inside the cooldown");
    assert_eq!(status(&s).await.queue_depth, 0);
}

// 4
#[actix::test]
async fn a_full_queue_is_refused_at_once() {
    let s = scheduler(x().limit(1).queue_capacity(2).max_wait(ms(2_000)));
    let upstream = s.upstream("x").expect("configured");
    let holder = upstream.request().acquire().await.expect("first permit");
    let mut waiters = Vec::new();
    for depth in 1..=2 {
        let upstream = upstream.clone();
        waiters.push(actix::spawn(async move { upstream.request().acquire().await.map(Permit::succeeded) }));
        until_queued(&s, depth).await;
    }

    let (result, elapsed) = timed(upstream.request().acquire()).await;
    let error = result.expect_err("the queue is full");
    assert_eq!((error.kind(), error.queue_capacity()), (ErrorKind::QueueFull, Some(2)), "{error:?}");
    assert!(elapsed < ms(50), "refused after {elapsed:?}");
    assert!(error.is_overload() && error.retry_after().is_some());

    // The two queued callers are still served.
    holder.succeeded();
    for waiter in waiters {
        let result = tokio::time::timeout(ms(200), waiter).await.expect("served promptly").expect("task");
        result.expect("permit");
    }
}

// 5
#[actix::test]
async fn an_open_breaker_refuses_without_calling_the_upstream_then_half_opens() {
    let breaker = BreakerConfig {
        failure_rate: 0.5,
        minimum_calls: 3,
        window: ms(10_000),
        open_for: ms(200),
        half_open_probes: 1,
        ..BreakerConfig::default()
    };
    let s = scheduler(x().breaker(breaker));
    let upstream = s.upstream("x").expect("configured");
    let invoked = Arc::new(AtomicUsize::new(0));
    let fail = invoked.clone();
    let failing = move |_: Attempt| {
        fail.fetch_add(1, SeqCst);
        async { Err::<(), _>(status_outcome(501)) }
    };
    for _ in 0..3 {
        let error = upstream.request().call(failing.clone()).await.expect_err("501");
        assert_eq!((error.kind(), error.attempts()), (ErrorKind::Upstream, Some(1)), "a 501 is not retried: {error:?}");
        assert_eq!(error.upstream_status(), Some(501));
    }
    assert_eq!(invoked.load(SeqCst), 3);
    assert_eq!(status(&s).await.breaker, "open");

    let (result, elapsed) = timed(upstream.request().call(failing.clone())).await;
    let error = result.expect_err("breaker open");
    assert_eq!(error.kind(), ErrorKind::BreakerOpen, "{error:?}");
    let retry_after = error.retry_after().expect("an open breaker says when to come back");
    assert!(elapsed < ms(50), "refused after {elapsed:?}");
    assert_eq!(invoked.load(SeqCst), 3, "the upstream was not called");
    assert!(retry_after > ms(100) && retry_after <= ms(200), "retry_after {retry_after:?}");
    assert!(error.is_overload() && error.retry_after() == Some(retry_after));
    let refused = upstream.request().acquire().await.map(drop).map_err(|error| error.kind());
    assert_eq!(refused, Err(ErrorKind::BreakerOpen), "acquire is refused too");

    // After open_for, one probe goes through; its success closes the breaker.
    tokio::time::sleep(retry_after + ms(20)).await;
    let counter = invoked.clone();
    let answer = upstream
        .request()
        .call(move |_| {
            counter.fetch_add(1, SeqCst);
            async { Ok::<_, Outcome>("probe") }
        })
        .await;
    assert_eq!(answer.expect("the half-open probe is admitted"), "probe");
    assert_eq!(invoked.load(SeqCst), 4);
    assert_eq!(status(&s).await.breaker, "closed");
}

// 6
#[actix::test]
async fn transient_failures_are_retried_within_the_budget_and_max_retries() {
    let strict = x()
        .retry_budget(RetryBudgetConfig { ratio: 0.0, min_per_second: 0, ttl: ms(10_000) })
        .backoff(Backoff { base: ms(5), max: ms(10), max_retries: 3 })
        .build()
        .expect("valid");
    let normal = UpstreamConfig::builder("normal")
        .backoff(Backoff { base: ms(5), max: ms(20), max_retries: 2 })
        .build()
        .expect("valid");
    let s = common::isolated().upstream(strict).upstream(normal).build().expect("scheduler");
    let upstream = s.upstream("x").expect("configured");

    let attempts = Arc::new(Mutex::new(Vec::new()));
    let always_503 = {
        let attempts = attempts.clone();
        move |attempt: Attempt| {
            attempts.lock().expect("lock").push(attempt.number);
            async { Err::<(), _>(status_outcome(503)) }
        }
    };

    let (result, elapsed) = timed(upstream.request().call(always_503.clone())).await;
    let error = result.expect_err("503");
    assert_eq!((error.kind(), error.attempts()), (ErrorKind::RetryBudgetSpent, Some(1)), "{error:?}");
    assert!(error.is_overload());
    assert_eq!(*attempts.lock().expect("lock"), [1], "no retry without budget");
    assert!(elapsed < ms(200), "{elapsed:?}");

    attempts.lock().expect("lock").clear();
    let error = s.upstream("normal").expect("configured").request().call(always_503).await.expect_err("503");
    assert_eq!(error.kind(), ErrorKind::Upstream, "{error:?}");
    assert_eq!((error.attempts(), error.outcome().and_then(Outcome::status)), (Some(3), Some(503)));
    assert_eq!(error.upstream_status(), Some(503));
    assert_eq!(*attempts.lock().expect("lock"), [1, 2, 3], "first attempt + max_retries");
}

// 7
#[actix::test]
async fn other_client_errors_are_never_retried_and_release_their_permit() {
    let breaker = BreakerConfig { minimum_calls: 1, ..BreakerConfig::default() };
    // Limit 1 and a short wait: a permit left behind would make the next call time out.
    // A total timeout bounds the test even if a 4xx were (wrongly) retried.
    let s = scheduler(x().limit(1).max_wait(ms(200)).total_timeout(ms(500)).breaker(breaker));
    let upstream = s.upstream("x").expect("configured");
    for code in [400, 401, 403, 404, 409, 422] {
        let invoked = Arc::new(AtomicUsize::new(0));
        let counter = invoked.clone();
        let error = upstream
            .request()
            .call(move |_| {
                counter.fetch_add(1, SeqCst);
                async move { Err::<(), _>(status_outcome(code)) }
            })
            .await
            .expect_err("client error");
        assert_eq!((error.kind(), error.attempts()), (ErrorKind::Upstream, Some(1)), "{code}: {error:?}");
        assert_eq!(error.upstream_status(), Some(code));
        assert!(!error.is_overload() && error.retry_after().is_none());
        assert_eq!(invoked.load(SeqCst), 1, "{code} was retried");
    }
    let st = status(&s).await;
    assert_eq!(st.breaker, "closed", "a client error is not the upstream's failure");
    assert_eq!((st.state, st.limit, st.wave), (WaveState::Normal, 1, 1));
}

/// A 429 with `Retry-After: retry_after` on the first attempt, a success on the second.
async fn retried_after_rate_limit(retry_after: &'static str, min_cooldown: Duration, cooldown: Duration) {
    let s = scheduler(seed().min_cooldown(min_cooldown).max_wait(ms(2_000)).total_timeout(ms(3_000)));
    let upstream = s.upstream("x").expect("configured");
    let log = Arc::new(Mutex::new(Vec::<(Attempt, Instant)>::new()));
    let attempts = log.clone();
    let answer = upstream
        .request()
        .call(move |attempt| {
            attempts.lock().expect("lock").push((attempt, Instant::now()));
            async move {
                if attempt.number == 1 {
                    Err(Outcome::from_status(429, Some(retry_after), SystemTime::now()))
                } else {
                    Ok(attempt.number)
                }
            }
        })
        .await;
    assert_eq!(answer.expect("retried after the cooldown"), 2);
    let log = log.lock().expect("lock").clone();
    assert_eq!(log.len(), 2);
    assert_eq!((log[0].0.wave, log[1].0.wave), (1, 2), "the retry has a new permit of the new wave");
    let gap = log[1].1 - log[0].1;
    // The local clock counts whole milliseconds: allow 1 ms of rounding.
    assert!(gap + MS >= cooldown, "retried {gap:?} after the 429, before the {cooldown:?} cooldown");
    assert!(gap < cooldown + ms(200), "retried {gap:?} after the 429 (cooldown {cooldown:?})");
    let st = status(&s).await;
    assert_eq!((st.state, st.limit, st.wave), (WaveState::Probe, 1, 2));
    assert_eq!(st.breaker, "closed", "a 429 is not a breaker failure");
    assert_eq!((st.in_flight_local, st.queue_depth), (0, 0));
}

// 8
#[actix::test]
async fn a_429_is_retried_through_a_new_permit_after_the_clamped_retry_after() {
    retried_after_rate_limit("0.05", ms(150), ms(150)).await;
}

// 8 (the other side of the clamp)
#[actix::test]
async fn a_429_is_retried_after_its_retry_after_when_above_the_minimum() {
    retried_after_rate_limit("0.2", ms(50), ms(200)).await;
}

// The default recovery: the first 429 steps the limit back and stops nobody; the rejected
// call alone waits its Retry-After, then retries through a new permit.
#[actix::test]
async fn by_default_a_429_steps_back_and_only_the_rejected_call_waits() {
    let s = scheduler(x().limit(4).max_wait(ms(2_000)).total_timeout(ms(3_000)));
    let upstream = s.upstream("x").expect("configured");
    let rejected_at = Arc::new(Mutex::new(None::<Instant>));
    let seen = rejected_at.clone();
    let handle = upstream.clone();
    let rejected = actix::spawn(async move {
        handle
            .request()
            .call(move |attempt| {
                let seen = seen.clone();
                async move {
                    if attempt.number == 1 {
                        *seen.lock().expect("lock") = Some(Instant::now());
                        Err(Outcome::from_status(429, Some("0.3"), SystemTime::now()))
                    } else {
                        Ok((attempt.number, attempt.wave, Instant::now()))
                    }
                }
            })
            .await
    });
    let start = Instant::now();
    while rejected_at.lock().expect("lock").is_none() {
        assert!(start.elapsed() < ms(500), "the first attempt never ran");
        tokio::time::sleep(MS).await;
    }
    tokio::time::sleep(ms(20)).await;
    let st = status(&s).await;
    assert_eq!((st.state, st.limit, st.wave), (WaveState::Degraded, 2, 2), "stepped back by half, no cooldown");
    // Others are served at once, at the stepped-back limit.
    let (other, took) = timed(upstream.request().acquire()).await;
    let other = other.expect("no cooldown");
    assert!(took < ms(50), "another caller waited {took:?}");
    assert_eq!((other.state(), other.limit(), other.wave()), (WaveState::Degraded, 2, 2));
    other.succeeded();
    // The rejected call waited its own Retry-After (300 ms) before its second attempt.
    let (number, wave, second_at) = rejected.await.expect("task").expect("retried");
    let first_at = rejected_at.lock().expect("lock").expect("first attempt");
    let gap = second_at - first_at;
    assert_eq!((number, wave), (2, 2));
    assert!(gap >= ms(300) && gap < ms(500), "retried {gap:?} after its 429 (Retry-After 300 ms)");
}

/// Acquires `n` permits at once, checks that the limit is exactly `n`, reports `n` successes.
async fn succeed_at_limit(s: &Scheduler, n: usize) {
    let upstream = s.upstream("x").expect("configured");
    let permits: Vec<Permit> =
        join_all((0..n).map(|_| upstream.request().acquire())).await.into_iter().map(|p| p.expect("permit")).collect();
    assert!(permits.iter().all(|p| p.limit() as usize == n), "granted at limit {n}");
    let extra = tokio::time::timeout(ms(20), upstream.request().acquire()).await;
    assert!(extra.is_err(), "a permit beyond the limit {n} was granted: {extra:?}");
    assert_eq!(status(s).await.in_flight_local, n);
    for permit in permits {
        permit.succeeded();
    }
}

// 9
#[actix::test]
async fn the_seed_walk_through() {
    let cooldown = ms(100);
    // The walk-through is the seed's recovery (the default is the adaptive one).
    let s = scheduler(x().limit(10).cooldown_ladder([cooldown]).recovery(Recovery::Seed));
    let upstream = s.upstream("x").expect("configured");
    let now = SystemTime::now;

    let a = upstream.request().acquire().await.expect("A");
    let b = upstream.request().acquire().await.expect("B");
    assert_eq!((a.wave(), a.state(), a.limit()), (1, WaveState::Normal, 10));
    assert_eq!(b.wave(), 1);

    // A's 429 cuts the limit once and starts the cooldown.
    let cut_at = Instant::now();
    a.report(Outcome::from_status(429, None, now()));
    let st = status(&s).await;
    assert_eq!((st.state, st.limit, st.wave, st.in_flight_local), (WaveState::Cooldown, 5, 2, 1));
    assert!(st.cooldown_remaining > Duration::ZERO && st.cooldown_remaining <= cooldown);

    // B's late 429 of the same burst changes nothing.
    b.report(Outcome::from_status(429, None, now()));
    let st = status(&s).await;
    assert_eq!((st.state, st.limit, st.wave, st.in_flight_local), (WaveState::Cooldown, 5, 2, 0));

    // Nothing is admitted before the cooldown ends; then PROBE at limit 1.
    let c = upstream.request().acquire().await.expect("a permit after the cooldown");
    let waited = cut_at.elapsed();
    assert!(waited + MS >= cooldown, "granted {waited:?} after the cut, during the cooldown");
    assert!(waited < cooldown + ms(200), "granted {waited:?} after the cut");
    assert_eq!((c.state(), c.limit(), c.wave()), (WaveState::Probe, 1, 2));
    let extra = tokio::time::timeout(ms(20), upstream.request().acquire()).await;
    assert!(extra.is_err(), "PROBE admits one call at a time: {extra:?}");
    c.succeeded();
    let st = status(&s).await;
    assert_eq!((st.state, st.limit), (WaveState::Probe, 1), "1 success of 3");
    succeed_at_limit(&s, 1).await;
    assert_eq!((status(&s).await.state, status(&s).await.limit), (WaveState::Probe, 1), "2 of 3");
    succeed_at_limit(&s, 1).await;

    // DEGRADED: 2 → 4 → 8, then NORMAL at 10.
    for (limit, next) in [(2, WaveState::Degraded), (4, WaveState::Degraded), (8, WaveState::Degraded)] {
        let st = status(&s).await;
        assert_eq!((st.state, st.limit, st.wave), (next, limit, 2));
        succeed_at_limit(&s, limit as usize).await;
    }
    let st = status(&s).await;
    assert_eq!((st.state, st.limit, st.wave), (WaveState::Normal, 10, 2));
    succeed_at_limit(&s, 10).await;
}

// 10
#[actix::test]
async fn every_call_ends_by_its_deadline() {
    let total = ms(300);
    // A call cut short by its deadline leaves its request at the provider: its permit stays held
    // for the hold (short here), then nothing is left behind.
    let hold = ms(200);
    let s = scheduler(x().limit(5).total_timeout(total).cancelled_call_hold(hold));
    let upstream = s.upstream("x").expect("configured");
    let invoked = Arc::new(AtomicUsize::new(0));
    let calls = (0..50).map(|_| {
        let (upstream, invoked) = (upstream.clone(), invoked.clone());
        async move {
            timed(upstream.request().call(move |_| {
                invoked.fetch_add(1, SeqCst);
                std::future::pending::<Result<(), Outcome>>()
            }))
            .await
        }
    });
    let results = tokio::time::timeout(ms(3_000), join_all(calls)).await.expect("a call hangs");
    for (result, elapsed) in results {
        let kind = result.as_ref().map_err(Error::kind).err();
        assert!(matches!(kind, Some(ErrorKind::DeadlinePassed | ErrorKind::WaitedTooLong)), "{result:?}");
        assert!(elapsed >= total - ms(10) && elapsed < total + ms(200), "ended after {elapsed:?}");
    }
    let invoked = invoked.load(SeqCst);
    assert!((5..=50).contains(&invoked), "{invoked} attempts");
    tokio::time::sleep(hold).await;
    let st = status(&s).await;
    assert_eq!((st.in_flight_local, st.queue_depth), (0, 0), "nothing left behind");
}

// 10 (429s too end with the total timeout)
#[actix::test]
async fn retries_after_429s_end_with_the_total_timeout() {
    let total = ms(350);
    let s = scheduler(x().cooldown_ladder([ms(100)]).total_timeout(total));
    let upstream = s.upstream("x").expect("configured");
    let invoked = Arc::new(AtomicUsize::new(0));
    let counter = invoked.clone();
    let (result, elapsed) = timed(upstream.request().call(move |_| {
        counter.fetch_add(1, SeqCst);
        async { Err::<(), _>(status_outcome(429)) }
    }))
    .await;
    let error = result.expect_err("always 429");
    assert_eq!(error.kind(), ErrorKind::DeadlinePassed, "{error:?}");
    let attempts = error.attempts().expect("a passed deadline counts the attempts");
    assert!(elapsed < total + ms(200), "ended after {elapsed:?}");
    assert_eq!(attempts as usize, invoked.load(SeqCst));
    // The first plain 429 only steps the limit back, so its retry goes at once; from then on
    // one attempt per 100 ms cooldown: at most 5 within 350 ms.
    assert!((2..=5).contains(&attempts), "{attempts} attempts, one per cooldown");
}

// A call that outlives call_timeout is a transient timeout, retried within max_retries.
#[actix::test]
async fn call_timeout_is_a_transient_failure() {
    let backoff = Backoff { base: ms(5), max: ms(5), max_retries: 1 };
    let s = scheduler(x().call_timeout(ms(50)).permit_ttl(ms(2_000)).total_timeout(ms(2_000)).backoff(backoff));
    let upstream = s.upstream("x").expect("configured");
    let invoked = Arc::new(AtomicUsize::new(0));
    let counter = invoked.clone();
    let (result, elapsed) = timed(upstream.request().call(move |attempt| {
        counter.fetch_add(1, SeqCst);
        assert_eq!(attempt.timeout, ms(50));
        std::future::pending::<Result<(), Outcome>>()
    }))
    .await;
    let error = result.expect_err("never answers");
    assert_eq!((error.kind(), error.attempts()), (ErrorKind::Upstream, Some(2)), "{error:?}");
    assert_eq!(error.upstream_status(), None, "a timeout has no status");
    assert!(error.is_timeout() && error.to_string().contains("timed out"), "{error}");
    assert_eq!(invoked.load(SeqCst), 2);
    assert!(elapsed >= ms(100) && elapsed < ms(300), "{elapsed:?}");
}

// 11
#[actix::test]
async fn invalid_configuration_is_refused_with_what_to_change() {
    let error = x().limit(0).build().expect_err("limit 0");
    let message = error.to_string();
    assert!(message.contains("`x`") && message.contains("set limit to at least 1"), "{message}");

    let error = x().permit_ttl(ms(1_000)).build().expect_err("ttl below the call timeout");
    assert!(error.to_string().contains("raise permit_ttl to at least 660s"), "{error}");

    let error = Scheduler::builder().build().expect_err("no upstream");
    assert!(matches!(error, BuildError::Config(ConfigError::NoUpstreams)), "{error:?}");
    assert!(error.to_string().contains("add at least one"), "{error}");

    let twice = || x().build().expect("valid");
    let error = Scheduler::builder().upstream(twice()).upstream(twice()).build().expect_err("duplicate");
    assert!(matches!(&error, BuildError::Config(ConfigError::DuplicateUpstream(name)) if name == "x"), "{error:?}");
    assert!(error.to_string().contains("distinct name"), "{error}");

    let s = scheduler(x());
    let unknown = s.upstream("unknown").expect_err("not configured");
    assert_eq!(unknown.name, "unknown");
    assert!(unknown.to_string().contains("configured upstreams: x"), "{unknown}");
}

// 11b: the deprecated by-name shorthands resolve the name on every call and refuse an unknown
// one with a typed error, before any wait and without calling the closure.
#[actix::test]
#[allow(deprecated)]
async fn the_deprecated_shorthands_refuse_an_unknown_name() {
    let s = scheduler(x());
    let invoked = Arc::new(AtomicUsize::new(0));
    let counter = invoked.clone();
    let result = s
        .call("unknown", move |_| {
            counter.fetch_add(1, SeqCst);
            async { Ok::<_, Outcome>(()) }
        })
        .await;
    let unknown = result.expect_err("not configured");
    assert_eq!((unknown.kind(), unknown.upstream()), (ErrorKind::UnknownUpstream, Some("unknown")));
    assert!(unknown.to_string().contains("configured upstreams: x"), "{unknown}");
    assert_eq!(invoked.load(SeqCst), 0);
    assert_eq!(s.acquire("unknown").await.map(drop).map_err(|e| e.kind()), Err(ErrorKind::UnknownUpstream));
    assert_eq!(s.status("unknown").await.map(drop).map_err(|e| e.kind()), Err(ErrorKind::UnknownUpstream));
}

// 12
#[actix::test]
async fn dropping_a_call_while_its_request_is_at_the_provider_holds_its_permit_until_the_hold() {
    // The provider goes on serving a request whose caller is gone: its slot stays taken until
    // the provider has plausibly finished (the hold; by default the call timeout).
    let hold = ms(250);
    let s = scheduler(x().limit(1).max_wait(ms(600)).cancelled_call_hold(hold));
    let upstream = s.upstream("x").expect("configured");
    let started = Arc::new(AtomicBool::new(false));
    let cancelled = Arc::new(AtomicBool::new(false));
    let (started2, cancelled2) = (started.clone(), cancelled.clone());
    let call = upstream.request().call(move |_| {
        let started = started2.clone();
        let guard = SetOnDrop(cancelled2.clone());
        async move {
            let _guard = guard;
            started.store(true, SeqCst);
            std::future::pending::<Result<(), Outcome>>().await
        }
    });
    let dropped_at = Instant::now();
    assert!(tokio::time::timeout(ms(50), call).await.is_err(), "the closure never finishes");
    assert!(started.load(SeqCst), "the closure was running when the call was dropped");
    assert!(cancelled.load(SeqCst), "the upstream future was dropped too");
    assert_eq!(status(&s).await.in_flight_local, 1, "held while the provider may still serve it");

    let (permit, _) = timed(upstream.request().acquire()).await;
    let permit = permit.expect("the dropped call's permit came back after the hold");
    let waited = dropped_at.elapsed();
    assert!(waited >= hold && waited < hold + ms(300), "capacity came back after {waited:?}");
    assert_eq!(status(&s).await.in_flight_local, 1);
    permit.succeeded();

    // A call dropped before its request was sent gives its permit back at once.
    let holder = upstream.request().acquire().await.expect("permit");
    let queued = upstream.request().call(|_| async { Ok::<_, Outcome>(()) });
    assert!(tokio::time::timeout(ms(50), queued).await.is_err(), "it waits behind the holder");
    drop(holder);
    let (again, elapsed) = timed(upstream.request().acquire()).await;
    assert!(elapsed < ms(100), "{elapsed:?}");
    again.expect("nothing held by the call that never sent").succeeded();
}

// 13
#[actix::test]
async fn a_permit_dropped_without_a_report_releases_its_capacity() {
    let s = scheduler(x().limit(1).max_wait(ms(300)));
    let upstream = s.upstream("x").expect("configured");
    let permit = upstream.request().acquire().await.expect("permit");
    assert_eq!(status(&s).await.in_flight_local, 1);
    drop(permit);
    let (again, elapsed) = timed(upstream.request().acquire()).await;
    let again = again.expect("capacity came back");
    assert!(elapsed < ms(50), "{elapsed:?}");

    // A queued caller gets the dropped permit's place at once (not at the next poll).
    let handle = upstream.clone();
    let waiter = actix::spawn(async move { timed(handle.request().acquire()).await });
    until_queued(&s, 1).await;
    let dropped_at = Instant::now();
    drop(again);
    let (granted, _) = waiter.await.expect("task");
    let granted = granted.expect("the waiter is served");
    assert!(dropped_at.elapsed() < ms(50), "served {:?} after the drop", dropped_at.elapsed());

    // A neutral outcome: nothing learned, nothing cut.
    drop(granted);
    let st = status(&s).await;
    assert_eq!((st.state, st.limit, st.wave, st.breaker), (WaveState::Normal, 1, 1, "closed"));
    assert_eq!((st.in_flight_local, st.queue_depth), (0, 0));
}

// Walk-through step 5: a 429 in PROBE starts a new wave one step up the cooldown ladder.
#[actix::test]
async fn a_429_during_probe_starts_a_new_wave_one_ladder_step_up() {
    let s = scheduler(seed().limit(4).cooldown_ladder([ms(100), ms(250)]));
    let upstream = s.upstream("x").expect("configured");
    let a = upstream.request().acquire().await.expect("A");
    a.report(status_outcome(429));
    let st = status(&s).await;
    assert_eq!((st.state, st.limit, st.wave), (WaveState::Cooldown, 2, 2));
    assert!(st.cooldown_remaining <= ms(100), "{:?}", st.cooldown_remaining);

    let probe = upstream.request().acquire().await.expect("probe");
    assert_eq!((probe.state(), probe.wave()), (WaveState::Probe, 2));
    let cut_at = Instant::now();
    probe.report(status_outcome(429));
    let st = status(&s).await;
    assert_eq!((st.state, st.limit, st.wave), (WaveState::Cooldown, 1, 3));
    assert!(st.cooldown_remaining > ms(150) && st.cooldown_remaining <= ms(250), "{:?}", st.cooldown_remaining);

    let next = upstream.request().acquire().await.expect("after the second cooldown");
    let waited = cut_at.elapsed();
    assert!(waited + MS >= ms(250) && waited < ms(450), "{waited:?}");
    assert_eq!((next.state(), next.wave()), (WaveState::Probe, 3));
}

// A 429 is never a circuit-breaker failure (while a 500 is, with the same breaker).
#[actix::test]
async fn rate_limits_never_open_the_breaker() {
    let breaker = BreakerConfig { failure_rate: 0.5, minimum_calls: 1, ..BreakerConfig::default() };
    let s = scheduler(seed().breaker(breaker));
    let upstream = s.upstream("x").expect("configured");
    let permits: Vec<Permit> =
        join_all((0..3).map(|_| upstream.request().acquire())).await.into_iter().map(|p| p.expect("permit")).collect();
    for permit in permits {
        permit.report(status_outcome(429));
    }
    let st = status(&s).await;
    assert_eq!((st.breaker, st.state, st.wave), ("closed", WaveState::Cooldown, 2));

    // The same breaker opens on a single 500: the test can tell the difference.
    let s = scheduler(x().breaker(breaker));
    let upstream = s.upstream("x").expect("configured");
    upstream.request().acquire().await.expect("permit").report(status_outcome(500));
    assert_eq!(status(&s).await.breaker, "open");
}

// A caller that gave up waiting is no longer "waiting": it must not take a queue slot.
#[actix::test]
async fn callers_that_gave_up_do_not_fill_the_queue() {
    let s = scheduler(x().limit(1).queue_capacity(2).max_wait(ms(5_000)));
    let upstream = s.upstream("x").expect("configured");
    let holder = upstream.request().acquire().await.expect("permit");
    // One caller waits at the head of the queue...
    let handle = upstream.clone();
    let waiting = actix::spawn(async move { handle.request().acquire().await.map(Permit::succeeded) });
    until_queued(&s, 1).await;
    // ...and one behind it gives up (an HTTP client that went away).
    let gave_up = tokio::time::timeout(ms(20), upstream.request().acquire()).await;
    assert!(gave_up.is_err(), "{gave_up:?}");

    // One caller waits, the capacity is 2: a new caller must be queued, not refused.
    let third = tokio::time::timeout(ms(50), upstream.request().acquire()).await;
    assert!(third.is_err(), "refused although only 1 of 2 queue slots is taken: {third:?}");
    assert_eq!(status(&s).await.queue_depth, 1, "queue_depth counts callers that are gone");

    holder.succeeded();
    tokio::time::timeout(ms(200), waiting).await.expect("served").expect("task").expect("permit");
}

// The Retry-After hint of a refused waiter: the rest of the cooldown while there is one, and
// never "retry at once" once it is over (an overload refusal must not invite a retry storm).
#[actix::test]
async fn a_refused_waiter_is_told_the_rest_of_the_cooldown_and_never_zero() {
    let cooldown = ms(250);
    let s = scheduler(seed().limit(10).max_wait(ms(100)).cooldown_ladder([cooldown]));
    let upstream = s.upstream("x").expect("configured");
    let a = upstream.request().acquire().await.expect("A");
    let b = upstream.request().acquire().await.expect("B");
    let cut_at = Instant::now();
    a.report(status_outcome(429));

    // Refused at once (max_wait ends inside the cooldown), told the rest of it.
    let error = upstream.request().acquire().await.expect_err("cooling down");
    assert_eq!(error.kind(), ErrorKind::WaitedTooLong, "{error:?}");
    let rest = error.retry_after().expect("the rest of the cooldown");
    assert!(rest > ms(150) && rest <= cooldown, "rest of the cooldown: {rest:?}");

    // The cooldown is over; PROBE admits 1 and B (of the old wave) still holds a permit.
    tokio::time::sleep((cut_at + cooldown + ms(60)).saturating_duration_since(Instant::now())).await;
    assert_eq!(status(&s).await.state, WaveState::Probe);
    let error = upstream.request().acquire().await.expect_err("at the PROBE limit");
    assert_eq!(error.kind(), ErrorKind::WaitedTooLong, "{error:?}");
    let hint = error.retry_after();
    assert!(hint.is_some_and(|d| d > Duration::ZERO), "an overload refusal says retry after {hint:?}: {error:?}");
    b.succeeded();
}

// Upstreams are independent: a 429 on one cuts only its own limit.
#[actix::test]
async fn upstreams_are_independent() {
    let s = common::isolated()
        .upstream(UpstreamConfig::builder("a").limit(4).recovery(Recovery::Seed).build().expect("valid"))
        .upstream(UpstreamConfig::builder("b").limit(4).build().expect("valid"))
        .build()
        .expect("scheduler");
    assert_eq!(s.mode().await.expect("mode"), wavegate::Mode::Local);
    s.upstream("a").expect("configured").request().acquire().await.expect("permit").report(status_outcome(429));
    let (permit, elapsed) = timed(s.upstream("b").expect("configured").request().acquire()).await;
    let permit = permit.expect("b is not cooling down");
    assert!(elapsed < ms(50), "{elapsed:?}");
    assert_eq!((permit.state(), permit.limit()), (WaveState::Normal, 4));
    let all = s.statuses().await.expect("statuses");
    let seen: Vec<_> = all.iter().map(|st| (st.upstream.as_str(), st.state, st.limit, st.in_flight_local)).collect();
    assert_eq!(seen, [("a", WaveState::Cooldown, 2, 0), ("b", WaveState::Normal, 4, 1)]);
    permit.succeeded();
}

#[actix::test]
async fn a_503_is_not_retried_before_its_retry_after() {
    let s = scheduler(x().limit(2).backoff(Backoff { base: ms(1), max: ms(2), max_retries: 2 }));
    let upstream = s.upstream("x").expect("configured");
    let started = Instant::now();
    let second_attempt_at = upstream
        .request()
        .call(move |attempt| async move {
            if attempt.number == 1 {
                Err(Outcome::from_status(503, Some("0.3"), SystemTime::now()))
            } else {
                Ok(started.elapsed())
            }
        })
        .await
        .expect("the retry succeeds");
    // The jittered backoff alone would retry within 2 ms.
    assert!(second_attempt_at >= ms(300), "retried after {second_attempt_at:?}, before the 503's Retry-After");
    assert!(second_attempt_at < ms(1_000), "{second_attempt_at:?}");
}

// A half-open probe slot is not lost when its caller goes away while the admission is on its
// way back (the ticket travels inside its guard, made by the supervisor).
#[actix::test]
async fn a_caller_dropped_while_admitted_as_a_probe_does_not_hold_the_breaker_half_open() {
    let breaker =
        BreakerConfig { minimum_calls: 1, open_for: ms(100), half_open_probes: 1, ..BreakerConfig::default() };
    let s = scheduler(x().breaker(breaker));
    let upstream = s.upstream("x").expect("configured");
    upstream.request().call(|_| async { Err::<(), _>(status_outcome(501)) }).await.expect_err("501");
    assert_eq!(status(&s).await.breaker, "open");
    tokio::time::sleep(ms(150)).await;
    // Polled once: the admission is asked for; the supervisor answers; the caller is gone
    // before it reads the answer.
    let mut gone = Box::pin(upstream.request().acquire());
    let mut cx = std::task::Context::from_waker(futures_util::task::noop_waker_ref());
    assert!(futures_util::FutureExt::poll_unpin(&mut gone, &mut cx).is_pending());
    tokio::time::sleep(ms(20)).await;
    drop(gone);
    tokio::time::sleep(ms(20)).await;
    let probe = upstream.request().acquire().await.expect("the probe slot of the caller that went away is free again");
    probe.succeeded();
}

/// The history (`Scheduler::history`) counts what happened in each second: the permits
/// granted and the longest wait among them, the 429s reported, the callers waiting and the
/// permits held when the sample was taken, and the change of state the 429 made.
#[actix::test]
async fn the_history_counts_each_seconds_grants_waits_and_429s() {
    let scheduler = scheduler(seed().limit(1).max_wait(ms(5_000)));
    let upstream = scheduler.upstream("x").unwrap();
    let first = upstream.request().acquire().await.expect("a free permit");
    let waiter = upstream.clone();
    let second = actix::spawn(async move { waiter.request().acquire().await });
    until_queued(&scheduler, 1).await;
    // A sample sees the held permit and the waiting caller.
    let deadline = Instant::now() + ms(3_000);
    loop {
        let history = scheduler.history().remove(0);
        if history.samples.last().is_some_and(|s| s.in_flight_local == 1 && s.waiting == 1) {
            break;
        }
        assert!(Instant::now() < deadline, "no sample with the permit and the waiter: {history:?}");
        tokio::time::sleep(ms(50)).await;
    }
    tokio::time::sleep(ms(300)).await;
    first.report(status_outcome(200));
    let second = second.await.expect("joined").expect("the permit after the first");
    second.report(status_outcome(429));
    // Within two ticks every count is in a sample.
    let deadline = Instant::now() + ms(3_000);
    let history = loop {
        let history = scheduler.history().remove(0);
        let granted: u32 = history.samples.iter().map(|s| s.granted).sum();
        let rate_limited: u32 = history.samples.iter().map(|s| s.rate_limited).sum();
        if granted == 2 && rate_limited == 1 {
            break history;
        }
        assert!(Instant::now() < deadline, "the grants and the 429 are not all counted: {history:?}");
        tokio::time::sleep(ms(50)).await;
    };
    assert_eq!(history.upstream, "x");
    let longest = history.samples.iter().map(|s| s.wait_max_ms).max().unwrap_or(0);
    assert!((300..5_000).contains(&longest), "the second caller waited about 300 ms or more, not {longest} ms");
    let states: Vec<WaveState> = history.changes.iter().map(|c| c.state).collect();
    assert_eq!(states.first(), Some(&WaveState::Normal), "{history:?}");
    assert!(states.contains(&WaveState::Cooldown), "the seed's 429 starts a cooldown: {history:?}");
    assert!(history.samples.windows(2).all(|w| w[0].at_ms <= w[1].at_ms), "oldest first");
    assert_eq!(scheduler.live_processes().await.expect("running"), None, "local mode counts no fleet");
}

/// A live burst in local mode: what was spent stays spent. 600 a minute (one per 100 ms),
/// burst 10, all 10 taken; cut to 3: the budget is 7 in debt, the next permit comes after
/// 0.7 s + 100 ms, not at once, and leaves the budget empty at 3; raised to 30: 27 at once.
#[actix::test]
async fn a_live_burst_keeps_what_was_spent_in_local_mode() {
    let s = scheduler(x().limit(100).requests_per_minute(600, 10).max_wait(ms(5_000)));
    let llm = s.upstream("x").expect("configured");
    for _ in 0..10 {
        llm.request().acquire().await.expect("the burst").succeeded();
    }
    let burst = |n| wavegate::LiveChange::set(wavegate::LiveSetting::RequestsBurst, n, None).expect("valid");
    llm.change_live(burst(3)).await.expect("applied");
    let (permit, waited) = timed(llm.request().acquire()).await;
    permit.expect("after the debt").succeeded();
    assert!(waited > ms(650) && waited < ms(1_000), "the debt of 7 and one interval: waited {waited:?}");
    llm.change_live(burst(30)).await.expect("applied");
    let (permits, took) = timed(join_all((0..27).map(|_| llm.request().acquire()))).await;
    assert!(permits.into_iter().all(|p| p.map(Permit::succeeded).is_ok()));
    assert!(took < ms(100), "27 at once after the raise: took {took:?}");
    let (_, waited) = timed(async { llm.request().acquire().await.expect("by the rate").succeeded() }).await;
    assert!(waited > ms(40), "the 28th waits for the rate: {waited:?}");
}
