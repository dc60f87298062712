//! The request actor: one per call. Admission → permit → the caller's future under its call
//! timeout → report the outcome → retry or finish.
//!
//! Each retry has one owner and an end:
//! * a 429 is retried through a **new permit** once the provider's `Retry-After` (if any)
//!   has passed for this call, so it also passes a shared cooldown like everyone else; it
//!   ends with the call's total timeout;
//! * a transient failure (502/503/504, connect, reset, timeout) is retried after exponential
//!   backoff with full jitter (and not before a 503's `Retry-After`), at most `max_retries`
//!   times, each retry withdrawn from the upstream's retry budget, all inside the total timeout;
//! * anything else ends the call at once.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::{Actor, ActorContext, ActorFutureExt, AsyncContext, Context, WrapFuture};
use tokio::sync::oneshot;
use wavegate_core::{Outcome, TransportError};

use tracing::Instrument;

use crate::error::Error;
use crate::messages::{Acquire, Admit, AttemptKind, Refusal};
use crate::metrics;
use crate::permit::Permit;
use crate::scheduler::Inner;

/// What the caller's closure learns about the attempt it is asked to make.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Attempt {
    /// 1 for the first attempt, 2 for the first retry, ...
    pub number: u32,
    /// The wave the attempt's permit was issued in.
    pub wave: u64,
    /// How long this attempt may run (the call timeout, or less near the deadline).
    pub timeout: Duration,
    /// How long this attempt waited for its permit (queue wait plus permit wait).
    pub waited: Duration,
}

/// One call in flight; it stops itself once the caller has its answer.
pub(crate) struct RequestActor {
    run: Option<Pin<Box<dyn Future<Output = ()>>>>,
}

impl std::fmt::Debug for RequestActor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RequestActor").finish_non_exhaustive()
    }
}

impl RequestActor {
    pub(crate) fn new<F, Fut, T>(
        inner: Arc<Inner>,
        upstream: usize,
        tokens: u64,
        f: F,
        reply: oneshot::Sender<Result<T, Error>>,
    ) -> Self
    where
        F: FnMut(Attempt) -> Fut + 'static,
        Fut: Future<Output = Result<(T, u64), Outcome>> + 'static,
        T: 'static,
    {
        let run = Box::pin(async move {
            let mut reply = reply;
            let call = run_call(inner, upstream, tokens, f);
            // A caller that goes away cancels the call; dropping it releases its permit.
            let result = tokio::select! {
                result = call => Some(result),
                () = reply.closed() => None,
            };
            if let Some(result) = result {
                let _ = reply.send(result);
            }
        });
        Self { run: Some(run) }
    }
}

impl Actor for RequestActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        if let Some(run) = self.run.take() {
            ctx.spawn(run.into_actor(self).map(|(), _, ctx| ctx.stop()));
        }
    }
}

/// Admission and a permit for one attempt.
pub(crate) async fn acquire_permit(
    inner: &Inner,
    upstream: usize,
    kind: AttemptKind,
    wait_until: Instant,
    tokens: u64,
) -> Result<Permit, Error> {
    let name = || inner.upstreams[upstream].name().to_string();
    let supervisor = inner.supervisors[upstream].clone();
    let admission = match supervisor.send(Admit { kind }).await {
        Ok(Ok(admission)) => admission,
        Ok(Err(Refusal::BreakerOpen(retry_after))) => return Err(Error::BreakerOpen { upstream: name(), retry_after }),
        Ok(Err(Refusal::BudgetSpent)) => {
            return Err(Error::RetryBudgetSpent { upstream: name(), attempts: 0, last: "transient" });
        }
        Err(_) => return Err(Error::Stopped),
    };
    let (reply, granted) = oneshot::channel();
    inner.coordinator.do_send(Acquire { upstream, tokens, deadline: wait_until, reply });
    let grant = granted.await.map_err(|_| Error::Stopped)??;
    Ok(Permit::new(upstream, name(), grant, tokens, admission.into_ticket(), inner.coordinator.clone(), supervisor))
}

async fn run_call<F, Fut, T>(inner: Arc<Inner>, upstream: usize, tokens: u64, f: F) -> Result<T, Error>
where
    F: FnMut(Attempt) -> Fut,
    Fut: Future<Output = Result<(T, u64), Outcome>>,
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
    let result = attempts(&inner, upstream, tokens, f, &mut log).instrument(span.clone()).await;
    let outcome = match &result {
        Ok(_) => "success",
        Err(Error::Upstream { outcome, .. }) => outcome.label(),
        Err(error) => error.code(),
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
}

async fn attempts<F, Fut, T>(
    inner: &Inner,
    upstream: usize,
    tokens: u64,
    mut f: F,
    log: &mut CallLog,
) -> Result<T, Error>
where
    F: FnMut(Attempt) -> Fut,
    Fut: Future<Output = Result<(T, u64), Outcome>>,
{
    let config = &inner.upstreams[upstream];
    let name = || config.name().to_string();
    let deadline = Instant::now() + config.total_timeout();
    let mut transient_retries = 0u32;
    let mut kind = AttemptKind::First;
    loop {
        let now = Instant::now();
        if now >= deadline {
            return Err(Error::DeadlinePassed { upstream: name(), attempts: log.attempts });
        }
        let wait_until = deadline.min(now + config.max_wait());
        let permit = match acquire_permit(inner, upstream, kind, wait_until, tokens).await {
            Ok(permit) => permit,
            Err(Error::WaitedTooLong { .. }) if Instant::now() >= deadline => {
                return Err(Error::DeadlinePassed { upstream: name(), attempts: log.attempts });
            }
            Err(Error::RetryBudgetSpent { upstream, .. }) => {
                return Err(Error::RetryBudgetSpent { upstream, attempts: log.attempts, last: "transient" });
            }
            Err(error) => return Err(error),
        };
        log.attempts += 1;
        log.wave = permit.wave();
        log.queue_wait += permit.queue_wait();
        log.permit_wait += permit.permit_wait();
        let remaining = deadline.saturating_duration_since(Instant::now());
        let timeout = config.call_timeout().min(remaining);
        let attempt = Attempt { number: log.attempts, wave: permit.wave(), timeout, waited: permit.waited() };
        let started = Instant::now();
        let answer = tokio::time::timeout(timeout, f(attempt)).await;
        log.call += started.elapsed();
        let outcome = match answer {
            Ok(Ok((value, used))) => {
                permit.report_usage(Outcome::Success { status: 200 }, used);
                return Ok(value);
            }
            Ok(Err(outcome)) => outcome,
            Err(_) if timeout < config.call_timeout() => {
                // Cut short by the deadline, not by the upstream: nothing to learn.
                drop(permit);
                return Err(Error::DeadlinePassed { upstream: name(), attempts: log.attempts });
            }
            Err(_) => Outcome::from_transport(TransportError::Timeout),
        };
        permit.report(outcome);
        match outcome {
            Outcome::RateLimited { retry_after } => {
                // The provider told this call when to come back: it alone waits that long
                // (bounded like a cooldown), then asks for a new permit, which passes a shared
                // cooldown if the 429 started one. A 429 that only stepped the limit back
                // stops nobody else.
                if let Some(after) = retry_after.map(|after| after.min(config.wave().cooldown.max())) {
                    let until = Instant::now() + after;
                    if until >= deadline {
                        return Err(Error::DeadlinePassed { upstream: name(), attempts: log.attempts });
                    }
                    tokio::time::sleep_until(until.into()).await;
                }
                metrics::retry(config.name().as_str(), "rate_limited");
                kind = AttemptKind::AfterRateLimit;
            }
            Outcome::Transient { retry_after, .. } if transient_retries < config.backoff().max_retries => {
                // Full jitter, but never sooner than the provider asked (a 503's Retry-After,
                // bounded like a cooldown).
                let jittered = config.backoff().delay(transient_retries, &mut rand::rng());
                let asked = retry_after.map(|after| after.min(config.wave().cooldown.max()));
                let delay = asked.map_or(jittered, |asked| jittered.max(asked));
                transient_retries += 1;
                let until = Instant::now() + delay;
                if until >= deadline {
                    return Err(Error::DeadlinePassed { upstream: name(), attempts: log.attempts });
                }
                metrics::retry(config.name().as_str(), "transient");
                tokio::time::sleep_until(until.into()).await;
                kind = AttemptKind::AfterTransient;
            }
            _ => return Err(Error::Upstream { upstream: name(), outcome, attempts: log.attempts }),
        }
    }
}
