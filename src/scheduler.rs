//! The `Scheduler` handle and its builder.

use std::future::Future;
use std::sync::Arc;
use std::time::Instant;

use actix::{Actor, Addr};
use tokio::sync::oneshot;
use wavegate_core::{ConfigError, MonotonicClock, Outcome, UpstreamConfig, UpstreamSet};
use wavegate_redis::{Store, StoreConfig, StoreError};

use crate::coordinator::Coordinator;
use crate::error::Error;
use crate::messages::{AttemptKind, ReadBreaker, ReadMode, ReadStatus};
use crate::permit::Permit;
use crate::request::{Attempt, RequestActor, acquire_permit};
use crate::status::{Mode, UpstreamStatus};
use crate::supervisor::UpstreamSupervisor;

/// What the handles share.
#[derive(Debug)]
pub(crate) struct Inner {
    pub(crate) upstreams: Vec<UpstreamConfig>,
    pub(crate) set: UpstreamSet,
    pub(crate) coordinator: Addr<Coordinator>,
    pub(crate) supervisors: Vec<Addr<UpstreamSupervisor>>,
}

/// Why a scheduler could not be built.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BuildError {
    /// The configuration cannot work; the message says what to change.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The Redis URL cannot be used.
    #[error("the Redis configuration cannot be used: {0}")]
    Store(#[from] StoreError),
}

/// A cheap-to-clone handle on the scheduler: put it in `web::Data` and call it from handlers.
///
/// Build it inside an actix system (actix-web's runtime, `#[actix::main]`, `#[actix::test]`):
/// its actors run there.
///
/// ```
/// use wavegate::{Outcome, Scheduler, UpstreamConfig};
///
/// # #[actix::main]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let scheduler = Scheduler::builder()
///     .upstream(UpstreamConfig::builder("llm").limit(4).build()?)
///     .build()?;
/// let answer = scheduler
///     .call("llm", |attempt| async move {
///         // ... send the request; map a 429/5xx to an `Outcome` error ...
///         Ok::<_, Outcome>(format!("answered on attempt {}", attempt.number))
///     })
///     .await?;
/// assert_eq!(answer, "answered on attempt 1");
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Scheduler {
    inner: Arc<Inner>,
}

impl Scheduler {
    /// A builder with no upstream and no Redis (local mode).
    pub fn builder() -> SchedulerBuilder {
        SchedulerBuilder { upstreams: Vec::new(), store: None }
    }

    fn index(&self, upstream: &str) -> Result<usize, Error> {
        self.inner.set.get(upstream)?;
        Ok(self.inner.upstreams.iter().position(|u| u.name().as_str() == upstream).unwrap_or_default())
    }

    /// Runs `f` against `upstream` with everything wavegate does: admission by the circuit
    /// breaker, a permit from the shared limit, the call timeout, the outcome reported to the
    /// wave and the breaker, retries (a 429 through a new permit; transient failures with
    /// backoff inside the retry budget), all inside the upstream's total timeout.
    ///
    /// `f` is called once per attempt and returns `Ok(value)` on success or the
    /// [`Outcome`] of a failure (`Outcome::from_status(..)`, `Outcome::from_transport(..)`).
    /// Dropping the returned future cancels the call and releases its permit.
    pub async fn call<F, Fut, T>(&self, upstream: &str, mut f: F) -> Result<T, Error>
    where
        F: FnMut(Attempt) -> Fut + 'static,
        Fut: Future<Output = Result<T, Outcome>> + 'static,
        T: 'static,
    {
        self.call_metered(upstream, 0, move |attempt| {
            let call = f(attempt);
            async move { call.await.map(|value| (value, 0)) }
        })
        .await
    }

    /// Like [`call`](Self::call), for an upstream with a tokens-per-minute budget: each
    /// attempt reserves `estimated_tokens`, and `f` returns the tokens it really used with its
    /// value, so the budget is settled (refund or extra charge). A 429 or another 4xx gives
    /// the reservation back.
    pub async fn call_metered<F, Fut, T>(&self, upstream: &str, estimated_tokens: u64, f: F) -> Result<T, Error>
    where
        F: FnMut(Attempt) -> Fut + 'static,
        Fut: Future<Output = Result<(T, u64), Outcome>> + 'static,
        T: 'static,
    {
        let index = self.index(upstream)?;
        let (reply, answer) = oneshot::channel();
        RequestActor::new(self.inner.clone(), index, estimated_tokens, f, reply).start();
        answer.await.map_err(|_| Error::Stopped)?
    }

    /// A permit for one call that the caller makes itself; report the outcome on it.
    /// Waits at most the upstream's `max_wait`.
    pub async fn acquire(&self, upstream: &str) -> Result<Permit, Error> {
        self.acquire_tokens(upstream, 0).await
    }

    /// A permit that reserves `estimated_tokens` of the upstream's tokens budget; settle the
    /// real usage with [`Permit::report_usage`].
    pub async fn acquire_tokens(&self, upstream: &str, estimated_tokens: u64) -> Result<Permit, Error> {
        let index = self.index(upstream)?;
        let wait_until = Instant::now() + self.inner.upstreams[index].max_wait();
        acquire_permit(&self.inner, index, AttemptKind::First, wait_until, estimated_tokens).await
    }

    /// The upstream's state as this process sees it.
    pub async fn status(&self, upstream: &str) -> Result<UpstreamStatus, Error> {
        let index = self.index(upstream)?;
        let (reply, answer) = oneshot::channel();
        self.inner.coordinator.do_send(ReadStatus { upstream: index, reply });
        let mut status = answer.await.map_err(|_| Error::Stopped)?;
        let breaker = self.inner.supervisors[index].send(ReadBreaker).await.map_err(|_| Error::Stopped)?;
        status.breaker = breaker.as_str();
        Ok(status)
    }

    /// The status of every upstream, in configuration order.
    pub async fn statuses(&self) -> Result<Vec<UpstreamStatus>, Error> {
        let mut all = Vec::with_capacity(self.inner.upstreams.len());
        for upstream in &self.inner.upstreams {
            all.push(self.status(upstream.name().as_str()).await?);
        }
        Ok(all)
    }

    /// Where permits come from now.
    pub async fn mode(&self) -> Result<Mode, Error> {
        self.inner.coordinator.send(ReadMode).await.map_err(|_| Error::Stopped)
    }

    /// The configured upstreams.
    pub fn upstreams(&self) -> impl Iterator<Item = &UpstreamConfig> {
        self.inner.upstreams.iter()
    }
}

/// Builds a [`Scheduler`].
#[derive(Debug)]
#[must_use = "call `build()` to start the scheduler"]
pub struct SchedulerBuilder {
    upstreams: Vec<UpstreamConfig>,
    store: Option<StoreConfig>,
}

impl SchedulerBuilder {
    /// Adds an upstream.
    pub fn upstream(mut self, upstream: UpstreamConfig) -> Self {
        self.upstreams.push(upstream);
        self
    }

    /// Shares permits and waves across processes through Redis at `url`
    /// (default timeouts: 250 ms per command, 500 ms to connect).
    pub fn redis(self, url: impl Into<String>) -> Self {
        self.store(StoreConfig::new(url))
    }

    /// Shares permits and waves through Redis, with explicit timeouts and key namespace.
    pub fn store(mut self, config: StoreConfig) -> Self {
        self.store = Some(config);
        self
    }

    /// Checks the configuration and starts the actors on the current actix system.
    pub fn build(self) -> Result<Scheduler, BuildError> {
        let set = UpstreamSet::new(self.upstreams.clone())?;
        let store = self.store.map(Store::connect_lazy).transpose()?;
        let clock = MonotonicClock::new();
        let supervisors = self.upstreams.iter().map(|u| UpstreamSupervisor::new(u, clock).start()).collect();
        let coordinator = Coordinator::new(self.upstreams.clone(), store).start();
        Ok(Scheduler { inner: Arc::new(Inner { upstreams: self.upstreams, set, coordinator, supervisors }) })
    }
}
