//! One call, driven in the caller's own task: admission → permit → the caller's future under
//! its call timeout → report the outcome → retry or finish.
//!
//! Like tower's `ResponseFuture`, the call is a future the caller polls: the actors (the
//! upstream's supervisor, the coordinator) answer its messages — admission, a permit, the
//! report — but the caller's closure and its futures never leave the caller's task, so they
//! may borrow (a `&reqwest::Client`, the handler's request) and need not be `Send` or
//! `'static`. Dropping the call's future cancels it and releases its permit.
//!
//! Each retry has one owner and an end:
//! * a 429 is retried through a **new permit** once the provider's `Retry-After` (if any)
//!   has passed for this call, so it also passes a shared cooldown like everyone else; it
//!   ends with the call's deadline (the upstream's total timeout, or sooner);
//! * a transient failure (500/502/503/504, connect, reset, timeout) is retried after
//!   exponential backoff with full jitter (and not before a 503's `Retry-After`), at most
//!   `max_retries` times, each retry withdrawn from the upstream's retry budget, all inside the
//!   deadline — only a connect error when the upstream opted out (`retry_transient(false)`:
//!   its calls are not safe to repeat);
//! * anything else ends the call at once, with the caller's result as it came.

use std::future::Future;
use std::time::Duration;

use tracing::Instrument;
use wavegate_core::{Outcome, RateLimitKind, TransportError};

use crate::attempt::{Attempt, acquire_permit};
use crate::classify::{Classify, Meter};
use crate::engine::clock::{self, Instant};
use crate::engine::request::{AttemptKind, Request};
use crate::error::{Error, ErrorKind};
use crate::handle::Inner;
use crate::metrics;
use crate::permit::Permit;
use crate::shadow::RetryCovered;

/// At most how long a retry in shadow waits for the verdict on the attempt before it (in a
/// fleet, a 429 quicker than its ghost's first answer waits for that answer): a ghost not
/// answered by then is taken as not granted at once.
const SHADOW_VERDICT_WAIT: Duration = Duration::from_secs(1);

/// A permit for a caller that makes the call itself: waits at most the upstream's `max_wait`,
/// and not past the request's deadline.
pub(crate) async fn acquire(inner: &Inner, upstream: usize, request: Request) -> Result<Permit, Error> {
    let config = &inner.upstreams[upstream];
    let now = Instant::now();
    let max_wait = clock::after(now, config.max_wait());
    let deadline_passed = || Error::deadline_passed(config.name().as_str(), 0);
    let wait_until = match request.deadline {
        Some(deadline) if deadline <= now => return Err(deadline_passed()),
        Some(deadline) => deadline.min(max_wait),
        None => max_wait,
    };
    match acquire_permit(inner, upstream, &request, AttemptKind::First, wait_until).await {
        // The deadline bound the wait (it passed, or no permit could come before it).
        Err(error) if error.kind() == ErrorKind::WaitedTooLong && request.deadline == Some(wait_until) => {
            Err(Error::deadline_passed_waiting(config.name().as_str(), &error, 0))
        }
        result => result,
    }
}

/// How a call that came back with a value ended: its last outcome, and with `keep` a
/// success's permit, still held un-reported (its answer goes on: a stream).
#[derive(Debug)]
pub(crate) struct Kept {
    /// The outcome of the last attempt (of the answer's head).
    pub(crate) outcome: Outcome,
    /// The attempts the call made.
    pub(crate) attempts: u32,
    /// The permit, still held.
    pub(crate) held: Option<Held>,
}

/// A success's permit kept held, and when its attempt's time is up.
#[derive(Debug)]
pub(crate) struct Held {
    pub(crate) permit: Permit,
    /// The end of the attempt's time: its call timeout, or the deadline if sooner.
    pub(crate) ends: Instant,
    /// The deadline came first: an answer cut there teaches nothing about the upstream.
    pub(crate) by_deadline: bool,
}

/// Runs the whole policy for one call; see the module docs. With `keep`, a call whose last
/// attempt succeeded comes back with its permit still held ([`Kept::held`]): its answer goes on.
pub(crate) async fn call<F, Fut, T, E, C, M>(
    inner: &Inner,
    upstream: usize,
    request: Request,
    classify: &C,
    meter: &M,
    f: F,
    keep: bool,
) -> Result<(T, Kept), Error<E>>
where
    F: FnMut(Attempt) -> Fut,
    Fut: Future<Output = Result<T, E>>,
    C: Classify<T, E>,
    M: Meter<T>,
{
    let name = inner.upstreams[upstream].name().as_str();
    let span = tracing::info_span!(
        "wavegate.call",
        upstream = name,
        attempts = tracing::field::Empty,
        wave = tracing::field::Empty,
        queue_wait_ms = tracing::field::Empty,
        permit_wait_ms = tracing::field::Empty,
        call_ms = tracing::field::Empty,
        outcome = tracing::field::Empty,
    );
    let mut log = CallLog::default();
    let result = attempts(inner, upstream, request, classify, meter, f, keep, &mut log).instrument(span.clone()).await;
    let outcome = match &result {
        Ok(_) => log.last.unwrap_or("success"),
        Err(error) => error.outcome().map_or(error.code(), Outcome::label),
    };
    let (queue_wait_ms, permit_wait_ms, call_ms) =
        (log.queue_wait.as_millis() as u64, log.permit_wait.as_millis() as u64, log.call.as_millis() as u64);
    span.record("attempts", log.attempts);
    span.record("wave", log.wave);
    span.record("queue_wait_ms", queue_wait_ms);
    span.record("permit_wait_ms", permit_wait_ms);
    span.record("call_ms", call_ms);
    span.record("outcome", outcome);
    span.in_scope(|| {
        tracing::debug!(
            upstream = name,
            attempts = log.attempts,
            wave = log.wave,
            queue_wait_ms,
            permit_wait_ms,
            call_ms,
            outcome,
            "call finished"
        );
    });
    result
}

/// The three waits of a call and its attempts, kept apart for logs.
#[derive(Debug, Default)]
struct CallLog {
    attempts: u32,
    wave: u64,
    /// Behind other callers of this process.
    queue_wait: Duration,
    /// At the head of the queue, for the limit or a cooldown.
    permit_wait: Duration,
    /// In the upstream call itself (all attempts).
    call: Duration,
    /// The label of the last attempt's outcome.
    last: Option<&'static str>,
}

#[allow(clippy::too_many_arguments)]
async fn attempts<F, Fut, T, E, C, M>(
    inner: &Inner,
    upstream: usize,
    mut request: Request,
    classify: &C,
    meter: &M,
    mut f: F,
    keep: bool,
    log: &mut CallLog,
) -> Result<(T, Kept), Error<E>>
where
    F: FnMut(Attempt) -> Fut,
    Fut: Future<Output = Result<T, E>>,
    C: Classify<T, E>,
    M: Meter<T>,
{
    let config = &inner.upstreams[upstream];
    let name = || config.name().to_string();
    let total = clock::after(Instant::now(), config.total_timeout());
    let deadline = request.deadline.map_or(total, |deadline| deadline.min(total));
    let mut transient_retries = 0u32;
    let mut kind = AttemptKind::First;
    // In shadow: the last attempt's verdict on its failure, read before the retry asks.
    let mut verdict: Option<RetryCovered> = None;
    loop {
        if let Some(verdict) = verdict.take() {
            // Known once its ghost's first answer is (a store round trip at most).
            let bound = SHADOW_VERDICT_WAIT.min(deadline.saturating_duration_since(Instant::now()));
            request.shadow_covered |= verdict.settled(bound).await;
        }
        let now = Instant::now();
        if now >= deadline {
            return Err(Error::deadline_passed(name(), log.attempts));
        }
        let wait_until = deadline.min(clock::after(now, config.max_wait()));
        let permit = match acquire_permit(inner, upstream, &request, kind, wait_until).await {
            Ok(permit) => permit,
            // The deadline bound the wait (it passed, or no permit could come before it).
            Err(error) if error.kind() == ErrorKind::WaitedTooLong && wait_until == deadline => {
                return Err(Error::deadline_passed_waiting(name(), &error, log.attempts));
            }
            Err(error) if matches!(error.kind(), ErrorKind::RetryBudgetSpent | ErrorKind::QuotaExhausted) => {
                return Err(error.with_attempts(log.attempts).widen());
            }
            Err(error) => return Err(error.widen()),
        };
        log.attempts += 1;
        // In shadow: once an attempt failed as enforcing would not have (or had no ghost), the
        // call's first ghost stands for the rest of it (known once the attempt is reported and
        // its ghost answered).
        let covered = permit.shadow_covers_retry();
        log.wave = permit.wave();
        log.queue_wait += permit.queue_wait();
        log.permit_wait += permit.permit_wait();
        let started = Instant::now();
        let timeout = config.call_timeout();
        let ran = attempt_on(permit, &mut f, log.attempts, deadline, timeout, classify, meter, keep).await;
        log.call += started.elapsed();
        let Some((outcome, result, kept)) = ran else {
            // Cut short by the deadline, not by the upstream: nothing to learn.
            return Err(Error::deadline_passed(name(), log.attempts));
        };
        log.last = Some(outcome.label());
        verdict = covered;
        if outcome.rate_limit_kind() == Some(RateLimitKind::QuotaExhausted) {
            // A billing state, not a rate limit: no retry (the report refused the upstream).
            let retry_after = inner.quota[upstream].remaining().unwrap_or(config.quota_pause());
            return Err(Error::quota_exhausted(name(), log.attempts, retry_after));
        }
        // A retry: how long this call alone waits first, what it asks for, why.
        let retry = match outcome {
            // The provider told this call when to come back: it alone waits that long
            // (bounded like a cooldown), then asks for a new permit, which passes a shared
            // cooldown if the 429 started one. A 429 that only stepped the limit back stops
            // nobody else.
            Outcome::RateLimited { retry_after, .. } => {
                let after = retry_after.map(|after| after.min(config.wave().cooldown.max()));
                Some((after, AttemptKind::AfterRateLimit, "rate_limited"))
            }
            // Full jitter, but never sooner than the provider asked (a 503's Retry-After,
            // bounded like a cooldown).
            Outcome::Transient { retry_after, .. }
                if transient_retries < config.backoff().max_retries
                    && (config.retries_transient() || outcome.never_sent()) =>
            {
                let jittered = config.backoff().delay(transient_retries, &mut rand::rng());
                let asked = retry_after.map(|after| after.min(config.wave().cooldown.max()));
                transient_retries += 1;
                Some((
                    Some(asked.map_or(jittered, |asked| jittered.max(asked))),
                    AttemptKind::AfterTransient,
                    "transient",
                ))
            }
            _ => None,
        };
        let Some((delay, next, reason)) = retry else {
            // The last answer comes back as it came: a value (a final 4xx response with its
            // body, say) as a value, the caller's error inside an `ErrorKind::Upstream` error.
            return match result {
                Some(Ok(value)) => Ok((value, Kept { outcome, attempts: log.attempts, held: kept })),
                Some(Err(source)) => Err(Error::upstream_failed(name(), outcome, log.attempts, Some(source))),
                None => Err(Error::upstream_failed(name(), outcome, log.attempts, None)),
            };
        };
        // Not the last answer: let go of it (and of what it holds) before waiting.
        drop((result, kept));
        if let Some(delay) = delay {
            let until = clock::after(Instant::now(), delay);
            if until >= deadline {
                return Err(Error::deadline_passed(name(), log.attempts));
            }
            metrics::retry(config.name().as_str(), reason);
            tokio::time::sleep_until(until).await;
        } else {
            metrics::retry(config.name().as_str(), reason);
        }
        kind = next;
    }
}

/// Runs attempt `number` on `permit`: the caller's future under the call timeout (less near the
/// `deadline`), its result classified and reported to the permit with its usage — except, with
/// `keep`, a success: its permit comes back, held, with when the attempt's time is up (its
/// answer goes on as a stream). `None`: the deadline cut it short (nothing to learn; the
/// permit, whose request is at the provider, stays held until the provider has plausibly
/// finished).
#[allow(clippy::too_many_arguments)]
pub(crate) async fn attempt_on<F, Fut, T, E, C, M>(
    mut permit: Permit,
    f: &mut F,
    number: u32,
    deadline: Instant,
    call_timeout: Duration,
    classify: &C,
    meter: &M,
    keep: bool,
) -> Option<(Outcome, Option<Result<T, E>>, Option<Held>)>
where
    F: FnMut(Attempt) -> Fut,
    Fut: Future<Output = Result<T, E>>,
    C: Classify<T, E>,
    M: Meter<T>,
{
    let timeout = call_timeout.min(deadline.saturating_duration_since(Instant::now()));
    let ends = clock::after(Instant::now(), timeout);
    let attempt = Attempt { number, wave: permit.wave(), timeout, waited: permit.waited() };
    // From here on the request is the provider's: a cancelled call keeps its permit until the
    // provider has plausibly finished with it.
    permit.request_sent();
    let (outcome, result) = match tokio::time::timeout(timeout, f(attempt)).await {
        Ok(result) => (classify.classify(&result), Some(result)),
        Err(_) if timeout < call_timeout => return None,
        Err(_) => (Outcome::from_transport(TransportError::Timeout), None),
    };
    match (&outcome, &result) {
        (Outcome::Success { .. }, Some(Ok(_))) if keep => {
            let held = Held { permit, ends, by_deadline: timeout < call_timeout };
            return Some((outcome, result, Some(held)));
        }
        (Outcome::Success { .. }, Some(Ok(value))) => {
            let used = meter.tokens_used(value, permit.reserved_tokens());
            permit.report_usage(outcome, used);
        }
        _ => permit.report(outcome),
    }
    Some((outcome, result, None))
}
