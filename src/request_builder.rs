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
use futures_util::Stream;

use crate::call;
use crate::classify::{ByError, Classify, Meter, Reserved};
use crate::engine::clock;
use crate::engine::request::{ClassRef, Request};
use crate::error::Error;
use crate::handle::Inner;
use crate::held::Hold;
use crate::permit::Permit;
use crate::stream::{HeldStream, StreamMeter};

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
        self.request.tokens = estimate.max(self.request.output);
        self
    }

    /// Says how many of the [`tokens`](Self::tokens) estimate are the answer's output (the
    /// request's `max_tokens`), for an upstream with an
    /// [output](crate::config::UpstreamConfigBuilder::output_tokens_per_minute) or
    /// [input](crate::config::UpstreamConfigBuilder::input_tokens_per_minute) tokens budget:
    /// `max_tokens` are reserved from the output budget, the rest of the estimate from the
    /// input one. Raises the estimate to `max_tokens` if it was smaller. Without it the whole
    /// estimate is input, and a usage known only in all settles what exceeds the estimate
    /// on the output. An output part above the output burst is refused at once
    /// ([`ErrorKind::InsufficientCapacity`](crate::ErrorKind::InsufficientCapacity)).
    ///
    /// ```no_run
    /// # async fn run(claude: wavegate::Upstream) -> Result<(), wavegate::Error> {
    /// // 10,000 tokens of prompt, up to 2,000 of answer.
    /// let permit = claude.request().tokens(12_000).output_tokens(2_000).acquire().await?;
    /// // ... the provider says it used 10,000 in and 350 out:
    /// permit.report_usage_parts(wavegate::Outcome::success(200), 10_000, 350);
    /// # Ok(()) }
    /// ```
    pub fn output_tokens(mut self, max_tokens: u64) -> Self {
        self.request.output = max_tokens;
        self.request.tokens = self.request.tokens.max(max_tokens);
        self
    }

    /// Puts the request in priority class `class` (configured with
    /// [`class`](crate::config::UpstreamConfigBuilder::class)): when callers of several classes
    /// wait, anywhere in the fleet, a free permit goes to the class furthest below its
    /// weighted share, earliest deadline first within a class (in each process). A class the upstream (a pool's
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
        let called = call::call(self.inner, self.target.0, self.request, &self.classify, &self.meter, f, false).await;
        called.map(|(value, _)| value)
    }

    /// Runs `f` like [`call`](Self::call), for an answer that is a stream (server-sent events,
    /// a body read in chunks): the value of the last attempt is turned into the stream by
    /// `into_stream` and comes back as a [`HeldStream`], which holds the permit until the
    /// stream ends, fails, runs out of time or is dropped (see [`stream`](crate::stream)).
    ///
    /// A 429 or a transient failure before the answer began (the classifier's verdict on the
    /// value, as for `call`) is retried as usual; once the stream is given back, nothing is
    /// retried. The [`meter`](Self::meter) is a [`StreamMeter`] here: it reads the usage the
    /// stream reports at its end (`SseUsage` with the feature `sse`, or any
    /// `FnMut(&Item) -> Option<u64>`), which settles the tokens budget; without one the
    /// reservation stands. A last value the classifier did not call a success (a final 400
    /// with its body) is turned into a stream too, its permit already reported.
    ///
    /// ```
    /// use futures_util::StreamExt;
    /// use wavegate::{Outcome, Scheduler, UpstreamConfig};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let scheduler = Scheduler::builder().upstream(UpstreamConfig::builder("llm").limit(2).build()?).build()?;
    /// let llm = scheduler.upstream("llm")?;
    /// let answer = llm
    ///     .request()
    ///     .call_stream(
    ///         |_attempt| async { Ok::<_, Outcome>(vec!["a", "b", "c"]) },
    ///         |chunks| futures_util::stream::iter(chunks.into_iter().map(Ok::<_, Outcome>)),
    ///     )
    ///     .await?;
    /// let text: Vec<_> = answer.collect().await;
    /// assert_eq!(text.len(), 3);
    /// # Ok(()) }
    /// ```
    pub async fn call_stream<F, Fut, T, E, S, I, SE>(
        self,
        f: F,
        into_stream: impl FnOnce(T) -> S,
    ) -> Result<HeldStream<S, M>, Error<E>>
    where
        F: FnMut(Attempt) -> Fut,
        Fut: Future<Output = Result<T, E>>,
        C: Classify<T, E>,
        S: Stream<Item = Result<I, SE>>,
        M: StreamMeter<I>,
    {
        let name = self.inner.upstreams[self.target.0].name().as_str();
        let called = call::call(self.inner, self.target.0, self.request, &self.classify, &Reserved, f, true).await;
        let (value, kept) = called?;
        Ok(HeldStream::new(into_stream(value), self.meter, Hold::new(name, kept)))
    }

    /// [`call`](Self::call), a success's permit kept held for an answer that goes on (the
    /// middleware's streamed bodies).
    #[cfg(feature = "reqwest-middleware")]
    pub(crate) async fn call_kept<F, Fut, T, E>(self, f: F) -> Result<(T, call::Kept), Error<E>>
    where
        F: FnMut(Attempt) -> Fut,
        Fut: Future<Output = Result<T, E>>,
        C: Classify<T, E>,
    {
        call::call(self.inner, self.target.0, self.request, &self.classify, &Reserved, f, true).await
    }

    /// A permit for one call that the caller makes itself; report the outcome on it
    /// ([`Permit::report`], [`Permit::report_usage`]). Waits at most the upstream's
    /// `max_wait` (and not past the deadline).
    pub async fn acquire(self) -> Result<Permit, Error> {
        call::acquire(self.inner, self.target.0, self.request).await
    }
}
