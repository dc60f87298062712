//! One request builder, for an upstream and for a pool.
//!
//! Every request starts with [`Upstream::request`](crate::Upstream::request) or
//! [`Pool::request`](crate::Pool::request) and says what it needs — an estimate of tokens, a
//! priority class and a tenant, a deadline, how its result is classified and metered — then
//! ends with `call` (wavegate runs the whole policy around the caller's closure) or `acquire`
//! (a [`Permit`] for a caller that makes the call itself). The same builder, the same settings
//! and the same rules for both targets; only the closure of a pooled call is also told which
//! member (key, deployment) it runs on. One builder rather than one method per variant, so what
//! a request carries can grow without new suffixes.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::attempt::Attempt;
use crate::call;
use crate::classify::{ByError, Classify, Meter, Reserved};
use crate::engine::clock;
use crate::engine::request::{ClassRef, Request};
use crate::error::Error;
use crate::handle::Inner;
use crate::permit::Permit;

/// A request's target: one upstream ([`Upstream::request`](crate::Upstream::request)).
#[derive(Debug, Clone, Copy)]
pub struct ToUpstream(pub(crate) usize);

/// A request's target: a pool of upstreams ([`Pool::request`](crate::Pool::request)); each
/// attempt goes to one member.
#[derive(Debug, Clone, Copy)]
pub struct ToPool(pub(crate) usize);

/// One request: what it needs, then how it runs. For an upstream (`T` = [`ToUpstream`], the
/// default) or a pool (`T` = [`ToPool`]).
///
/// * [`tokens`](Self::tokens): the estimate to reserve from a tokens-per-minute budget;
/// * [`priority`](Self::priority): its priority class (default: the upstream's default class);
/// * [`tenant`](Self::tenant): its tenant, for fairness among the tenants of its class;
/// * [`deadline`](Self::deadline) / [`timeout`](Self::timeout): when the whole request must be
///   over (waits, attempts, retries, moves between a pool's members);
/// * [`classify`](Self::classify): what the caller's result means (default [`ByError`]);
/// * [`meter`](Self::meter): how many tokens a result really used (default: the estimate).
///
/// A builder does nothing until `call` or `acquire` is awaited.
#[derive(Debug)]
#[must_use = "a request does nothing until `.call(..)` or `.acquire()` is awaited"]
pub struct RequestBuilder<'a, T = ToUpstream, C = ByError, M = Reserved> {
    pub(crate) inner: &'a Inner,
    pub(crate) target: T,
    pub(crate) request: Request,
    pub(crate) classify: C,
    pub(crate) meter: M,
}

impl<'a, T> RequestBuilder<'a, T> {
    /// A request of `target`, nothing said yet.
    pub(crate) fn new(inner: &'a Inner, target: T) -> Self {
        Self { inner, target, request: Request::default(), classify: ByError, meter: Reserved }
    }
}

impl<'a, T, C, M> RequestBuilder<'a, T, C, M> {
    /// Reserves `estimate` tokens of the upstream's tokens-per-minute budget for each attempt;
    /// the real usage is settled with the [`meter`](Self::meter) (or
    /// [`Permit::report_usage`]). An estimate that can never fit the budget's burst is refused
    /// at once ([`ErrorKind::InsufficientCapacity`](crate::ErrorKind::InsufficientCapacity)).
    pub fn tokens(mut self, estimate: u64) -> Self {
        self.request.tokens = estimate;
        self
    }

    /// Puts the request in priority class `class` (configured with
    /// [`class`](crate::config::UpstreamConfigBuilder::class)): when callers of several classes
    /// wait, anywhere in the fleet, a free permit goes to the class furthest below its
    /// weighted share, first in first out within a class. A class the upstream (a pool's
    /// member) does not have is refused when the request runs, before any wait
    /// ([`ErrorKind::UnknownClass`](crate::ErrorKind::UnknownClass)).
    pub fn priority(mut self, class: &str) -> Self {
        self.request.class = ClassRef::Named(class.into());
        self
    }

    /// Names the request's tenant (a user, an API key): among the tenants of the request's
    /// class that wait, the next permit goes to the one holding the fewest permits — across
    /// the fleet on an upstream with priority classes, in this process otherwise — first in
    /// first out within a tenant, so one tenant's flood does not starve the others. The key
    /// itself stays in the process: Redis sees a 64-bit hash of it in permit ids, metrics see
    /// nothing.
    pub fn tenant(mut self, tenant: impl Into<Arc<str>>) -> Self {
        self.request.tenant = Some(wavegate_core::TenantTag::of(&tenant.into()));
        self
    }

    /// The whole request (waiting, every attempt and retry) ends by `deadline`
    /// ([`ErrorKind::DeadlinePassed`](crate::ErrorKind::DeadlinePassed)); the upstream's
    /// `total_timeout` still applies if it comes first. For `acquire` the wait ends at the
    /// deadline or after `max_wait`, whichever comes first.
    pub fn deadline(mut self, deadline: Instant) -> Self {
        self.request.deadline = Some(clock::from_std(deadline));
        self
    }

    /// [`deadline`](Self::deadline) `timeout` from now.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.request.deadline = Some(clock::after(clock::Instant::now(), timeout));
        self
    }

    /// Classifies each attempt's result with `classify` (a [`Classify`], e.g. a
    /// `|result: &Result<T, E>| -> Outcome` closure, or [`ByStatus`](crate::ByStatus) for HTTP
    /// responses) instead of [`ByError`].
    pub fn classify<C2>(self, classify: C2) -> RequestBuilder<'a, T, C2, M> {
        let Self { inner, target, request, meter, .. } = self;
        RequestBuilder { inner, target, request, classify, meter }
    }

    /// Reads the tokens a successful call really used from its value (a [`Meter`], e.g.
    /// `|reply: &Reply| reply.usage.total_tokens`), so the tokens budget is settled: the
    /// difference with the estimate is refunded or charged.
    pub fn meter<M2>(self, meter: M2) -> RequestBuilder<'a, T, C, M2> {
        let Self { inner, target, request, classify, .. } = self;
        RequestBuilder { inner, target, request, classify, meter }
    }
}

impl<'a, C, M> RequestBuilder<'a, ToUpstream, C, M> {
    /// Runs `f` with everything wavegate does: admission by the circuit breaker, a permit
    /// from the (shared) limit, the call timeout, the outcome reported to the wave and the
    /// breaker, retries (a 429 through a new permit; transient failures with backoff inside
    /// the retry budget), all before the deadline.
    ///
    /// `f` is called once per attempt and returns the caller's own `Result<T, E>`; the
    /// classifier says what it means. The last result comes back untouched: `Ok(value)` as
    /// `Ok(value)`, `Err(e)` inside an [`Error`] of kind
    /// [`ErrorKind::Upstream`](crate::ErrorKind::Upstream) (`source_error()`; see
    /// [`classify`](crate::classify) for the rules). The future runs in the caller's task, so
    /// `f`, its futures and `T` may borrow.
    ///
    /// Dropping the future cancels the call: a permit still waited for goes back at once; one
    /// whose request is at the provider stays held until the provider has plausibly finished
    /// (the upstream's `cancelled_call_hold`, by default its call timeout).
    ///
    /// Needs a tokio runtime with its timer enabled (`#[tokio::main]`, `#[tokio::test]`,
    /// actix) in the caller's task.
    pub async fn call<F, Fut, T, E>(self, f: F) -> Result<T, Error<E>>
    where
        F: FnMut(Attempt) -> Fut,
        Fut: Future<Output = Result<T, E>>,
        C: Classify<T, E>,
        M: Meter<T>,
    {
        call::call(self.inner, self.target.0, self.request, &self.classify, &self.meter, f).await
    }

    /// A permit for one call that the caller makes itself; report the outcome on it
    /// ([`Permit::report`], [`Permit::report_usage`]). Waits at most the upstream's
    /// `max_wait` (and not past the deadline).
    pub async fn acquire(self) -> Result<Permit, Error> {
        call::acquire(self.inner, self.target.0, self.request).await
    }
}
