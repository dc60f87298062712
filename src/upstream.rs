//! A handle per upstream and one request builder.
//!
//! [`Scheduler::upstream`](crate::Scheduler::upstream) resolves a name once and gives an
//! [`Upstream`]: cheap to clone, `Send + Sync`, no lookup per call. Every request starts with
//! [`Upstream::request`] and says what it needs — an estimate of tokens, a deadline, how its
//! result is classified — and ends with [`call`](RequestBuilder::call) (wavegate runs the
//! whole policy around the caller's closure) or [`acquire`](RequestBuilder::acquire) (a
//! [`Permit`] for a caller that makes the call itself). One builder rather than one method per
//! variant, so what a request carries can grow (a priority, a tenant) without new suffixes.
//!
//! The call runs in the caller's task: the closure, its futures and the value may borrow.
//!
//! ```
//! use std::time::{Duration, Instant};
//! use wavegate::{Error, Outcome, Scheduler, UpstreamConfig};
//!
//! /// Stands for an HTTP client the handler owns and lends.
//! struct Client { base: String }
//!
//! impl Client {
//!     async fn complete(&self, prompt: &str) -> Result<String, Outcome> {
//!         Ok(format!("{}: {prompt}", self.base))
//!     }
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let scheduler = Scheduler::builder()
//!     .upstream(UpstreamConfig::builder("llm").limit(4).build()?)
//!     .build()?; // no actix system here: the actors get a thread of their own
//! let llm = scheduler.upstream("llm")?;
//!
//! let client = Client { base: "llm".to_string() };
//! let prompt = String::from("hello");
//! let answer = llm
//!     .request()
//!     .deadline(Instant::now() + Duration::from_secs(10))
//!     .call(|_attempt| client.complete(&prompt)) // borrows `client` and `prompt`
//!     .await?;
//! assert_eq!(answer, "llm: hello");
//!
//! let permit = llm.request().acquire().await?;
//! permit.succeeded();
//! assert!(matches!(scheduler.upstream("nope"), Err(wavegate::UnknownUpstream { .. })));
//! # let _: Option<Error> = None;
//! # Ok(()) }
//! ```

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use wavegate_core::UpstreamConfig;

use crate::attempt::Attempt;
use crate::call;
use crate::classify::{ByError, Classify, Meter, Reserved};
use crate::engine::clock;
use crate::engine::request::{ClassRef, Request};
use crate::error::Error;
use crate::handle::Inner;
use crate::permit::Permit;
use crate::status::{Mode, UpstreamStatus};

/// One configured upstream of a [`Scheduler`](crate::Scheduler), resolved once.
///
/// Holds the scheduler alive (its actors stop when the last scheduler handle and the last
/// upstream handle are gone).
#[derive(Debug, Clone)]
pub struct Upstream {
    inner: Arc<Inner>,
    index: usize,
}

impl Upstream {
    pub(crate) fn new(inner: Arc<Inner>, index: usize) -> Self {
        Self { inner, index }
    }

    /// The upstream's name.
    pub fn name(&self) -> &str {
        self.config().name().as_str()
    }

    /// The upstream's configuration.
    pub fn config(&self) -> &UpstreamConfig {
        &self.inner.upstreams[self.index]
    }

    /// A request to this upstream; say what it needs, then [`call`](RequestBuilder::call) or
    /// [`acquire`](RequestBuilder::acquire).
    pub fn request(&self) -> RequestBuilder<'_> {
        RequestBuilder::new(&self.inner, self.index)
    }

    /// The upstream's state as this process sees it.
    pub async fn status(&self) -> Result<UpstreamStatus, Error> {
        self.inner.status(self.index).await
    }

    /// Where the upstream's permits come from now (no Redis round trip); see
    /// [`Scheduler::mode`](crate::Scheduler::mode) for the process as a whole.
    pub async fn mode(&self) -> Result<Mode, Error> {
        self.inner.engine.mode(Some(self.index)).await
    }

    /// Lifts the refusal a spent quota put on the upstream in this process (an operator's
    /// reset, e.g. after paying the bill); says whether there was one. See
    /// [`ErrorKind::QuotaExhausted`](crate::ErrorKind::QuotaExhausted).
    pub fn reset_quota(&self) -> bool {
        let lifted = self.inner.quota[self.index].reset();
        if lifted {
            let upstream = self.name();
            tracing::info!(upstream, "quota refusal lifted by an operator");
            crate::metrics::quota_exhausted(upstream, false);
        }
        lifted
    }
}

/// One request to an upstream: what it needs, then how it runs.
///
/// * [`tokens`](Self::tokens): the estimate to reserve from a tokens-per-minute budget;
/// * [`priority`](Self::priority): its priority class (default: the upstream's default class);
/// * [`deadline`](Self::deadline) / [`timeout`](Self::timeout): when the whole request must be
///   over (waits, attempts and retries), never later than the upstream's `total_timeout`;
/// * [`classify`](Self::classify): what the caller's result means (default [`ByError`]);
/// * [`meter`](Self::meter): how many tokens a result really used (default: the estimate).
///
/// A builder does nothing until [`call`](Self::call) or [`acquire`](Self::acquire) is awaited.
#[derive(Debug)]
#[must_use = "a request does nothing until `.call(..)` or `.acquire()` is awaited"]
pub struct RequestBuilder<'u, C = ByError, M = Reserved> {
    inner: &'u Inner,
    index: usize,
    request: Request,
    classify: C,
    meter: M,
}

impl<'u> RequestBuilder<'u> {
    pub(crate) fn new(inner: &'u Inner, index: usize) -> Self {
        let request = Request::new(inner.upstreams[index].default_class());
        Self { inner, index, request, classify: ByError, meter: Reserved }
    }
}

impl<'u, C, M> RequestBuilder<'u, C, M> {
    /// Reserves `estimate` tokens of the upstream's tokens-per-minute budget for each attempt;
    /// the real usage is settled with the [`meter`](Self::meter) (or
    /// [`Permit::report_usage`]). An estimate that can never fit the budget's burst is refused
    /// at once ([`ErrorKind::InsufficientCapacity`](crate::ErrorKind::InsufficientCapacity)).
    pub fn tokens(mut self, estimate: u64) -> Self {
        self.request.tokens = estimate;
        self
    }

    /// The whole request (waiting, every attempt and retry) ends by `deadline`
    /// ([`ErrorKind::DeadlinePassed`](crate::ErrorKind::DeadlinePassed)); the upstream's
    /// `total_timeout` still applies if it comes first. For [`acquire`](Self::acquire) the wait
    /// ends at the deadline or after `max_wait`, whichever comes first.
    pub fn deadline(mut self, deadline: Instant) -> Self {
        self.request.deadline = Some(clock::from_std(deadline));
        self
    }

    /// Puts the request in priority class `class` (configured with
    /// [`class`](crate::config::UpstreamConfigBuilder::class)): when callers of several classes
    /// wait, anywhere in the fleet, a free permit goes to the class furthest below its
    /// weighted share, first in first out within a class. A class the upstream does not have
    /// is refused when the request runs, before any wait
    /// ([`ErrorKind::UnknownClass`](crate::ErrorKind::UnknownClass)).
    pub fn priority(mut self, class: &str) -> Self {
        self.request.class = match self.inner.upstreams[self.index].class_index(class) {
            Some(index) => ClassRef::Known(index),
            None => ClassRef::Unknown(class.into()),
        };
        self
    }

    /// Names the request's tenant (a user, an API key): among the tenants of the request's
    /// class that wait, the next permit goes to the one holding the fewest permits — across
    /// the fleet on an upstream with priority classes, in this process otherwise — first in
    /// first out within a tenant, so one tenant's flood does not starve the others. The key
    /// itself stays in the process: Redis sees a 64-bit hash of it in permit ids
    /// (`wavegate_core::tenant::tenant_tag`), metrics see nothing.
    pub fn tenant(mut self, tenant: impl Into<Arc<str>>) -> Self {
        self.request.tenant = Some(wavegate_core::TenantTag::of(&tenant.into()));
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
    pub fn classify<C2>(self, classify: C2) -> RequestBuilder<'u, C2, M> {
        RequestBuilder { inner: self.inner, index: self.index, request: self.request, classify, meter: self.meter }
    }

    /// Reads the tokens a successful call really used from its value (a [`Meter`], e.g.
    /// `|reply: &Reply| reply.usage.total_tokens`), so the tokens budget is settled: the
    /// difference with the estimate is refunded or charged.
    pub fn meter<M2>(self, meter: M2) -> RequestBuilder<'u, C, M2> {
        RequestBuilder { inner: self.inner, index: self.index, request: self.request, classify: self.classify, meter }
    }

    /// Runs `f` with everything wavegate does: admission by the circuit breaker, a permit
    /// from the (shared) limit, the call timeout, the outcome reported to the wave and the
    /// breaker, retries (a 429 through a new permit; transient failures with backoff inside
    /// the retry budget), all before the deadline.
    ///
    /// `f` is called once per attempt and returns the caller's own `Result<T, E>`; the
    /// classifier says what it means. The last result comes back untouched: `Ok(value)` as
    /// `Ok(value)`, `Err(e)` as an [`ErrorKind::Upstream`](crate::ErrorKind::Upstream) error
    /// holding `e` (see [`classify`](crate::classify) for the rules). The future runs in the caller's task, so
    /// `f`, its futures and `T` may borrow; dropping it cancels the call and releases its
    /// permit.
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
        call::call(self.inner, self.index, self.request, &self.classify, &self.meter, f).await
    }

    /// A permit for one call that the caller makes itself; report the outcome on it
    /// ([`Permit::report`], [`Permit::report_usage`]). Waits at most the upstream's
    /// `max_wait` (and not past the deadline).
    pub async fn acquire(self) -> Result<Permit, Error> {
        call::acquire(self.inner, self.index, self.request).await
    }
}
