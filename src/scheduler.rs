//! The `Scheduler` handle and its builder.

use std::future::Future;
use std::sync::Arc;

use wavegate_core::{Instance, Outcome, PoolConfig, PoolConfigError, UnknownUpstream, UpstreamConfig, UpstreamSet};
#[cfg(feature = "redis")]
use wavegate_redis::{Keyspace, StoreConfig, StoreHealth};

use crate::attempt::Attempt;
use crate::build_error::BuildError;
use crate::engine::store::Store;
use crate::engine::{Engine, Shared};
use crate::error::Error;
use crate::handle::Inner;
use crate::handle::PoolSlot;
use crate::history::UpstreamHistory;
use crate::permit::Permit;
use crate::pool::Pool;
use crate::registry::Registration;
use crate::request_builder::{RequestBuilder, ToUpstream};
use crate::status::{Mode, UpstreamStatus};
use crate::upstream::Upstream;

/// A cheap-to-clone handle on the scheduler: build it once per process, put it in
/// `web::Data` (or your app's state) and call it from handlers.
///
/// It runs on any tokio runtime. Built inside an actix system (actix-web's runtime,
/// `#[actix::main]`, `#[actix::test]`) its actors run on the current arbiter; elsewhere
/// (axum, a plain `#[tokio::main]`, `#[tokio::test]`) they get a thread of their own, which
/// stops when the last handle is dropped. Calls are futures polled in the caller's task.
///
/// Resolve an upstream once with [`upstream`](Self::upstream) and work on its handle: build
/// requests with [`Upstream::request`], read its [`status`](Upstream::status) and
/// [`mode`](Upstream::mode), [`reset_quota`](Upstream::reset_quota). The by-name shorthands of
/// 0.1 ([`call`](Self::call), [`acquire`](Self::acquire), [`status`](Self::status), ...) are
/// deprecated; each one's note says what to write instead.
///
/// ```
/// use wavegate::{Outcome, Scheduler, UpstreamConfig};
///
/// # #[actix::main]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let scheduler = Scheduler::builder()
///     .upstream(UpstreamConfig::builder("llm").limit(4).build()?)
///     .build()?;
/// let llm = scheduler.upstream("llm")?;
/// let answer = llm
///     .request()
///     .call(|attempt| async move {
///         // ... send the request; map a 429/5xx to an `Outcome` error ...
///         Ok::<_, Outcome>(format!("answered on attempt {}", attempt.number))
///     })
///     .await?;
/// assert_eq!(answer, "answered on attempt 1");
/// assert_eq!(llm.status().await?.in_flight_local, 0);
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Scheduler {
    inner: Arc<Inner>,
}

impl Scheduler {
    /// A builder with no upstream and no Redis (local mode).
    pub fn builder() -> SchedulerBuilder {
        SchedulerBuilder {
            pools: Vec::new(),
            upstreams: Vec::new(),
            #[cfg(feature = "redis")]
            store: None,
            namespace: None,
        }
    }

    fn index(&self, upstream: &str) -> Result<usize, UnknownUpstream> {
        self.inner.set.get(upstream)?;
        Ok(self.inner.upstreams.iter().position(|u| u.name().as_str() == upstream).unwrap_or_default())
    }

    /// The handle of upstream `name`, resolved once: build its requests with
    /// [`Upstream::request`].
    ///
    /// ```
    /// # use wavegate::{Scheduler, UpstreamConfig};
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let scheduler = Scheduler::builder().upstream(UpstreamConfig::builder("llm").limit(2).build()?).build()?;
    /// let llm = scheduler.upstream("llm")?;
    /// let permit = llm.request().tokens(0).acquire().await?;
    /// permit.succeeded();
    /// let unknown = scheduler.upstream("lmm").unwrap_err();
    /// assert_eq!(unknown.name, "lmm");
    /// # Ok(()) }
    /// ```
    pub fn upstream(&self, name: &str) -> Result<Upstream, UnknownUpstream> {
        Ok(Upstream::new(self.inner.clone(), self.index(name)?))
    }

    fn request(&self, upstream: &str) -> Result<RequestBuilder<'_>, UnknownUpstream> {
        Ok(RequestBuilder::new(&self.inner, ToUpstream(self.index(upstream)?)))
    }

    /// Runs `f` against `upstream` with everything wavegate does (see
    /// [`RequestBuilder::call`]), `f` failing with an [`Outcome`].
    ///
    /// A shorthand for `self.upstream(upstream)?.request().call(f)` with the error turned into
    /// a plain [`Error`] ([`Error::without_source`]).
    #[deprecated(
        since = "0.2.0",
        note = "resolve the upstream once and build the request on it: \
                `scheduler.upstream(name)?.request().call(f).await` (its error keeps the closure's \
                `Outcome`; add `.map_err(wavegate::Error::without_source)` for a plain `Error`)"
    )]
    pub async fn call<F, Fut, T>(&self, upstream: &str, f: F) -> Result<T, Error>
    where
        F: FnMut(Attempt) -> Fut,
        Fut: Future<Output = Result<T, Outcome>>,
    {
        self.request(upstream)?.call(f).await.map_err(Error::without_source)
    }

    /// Like [`call`](Self::call), for an upstream with a tokens-per-minute budget: each
    /// attempt reserves `estimated_tokens`, and `f` returns the tokens it really used with its
    /// value, so the budget is settled (refund or extra charge). A 429 or another 4xx gives
    /// the reservation back.
    ///
    /// A shorthand for `request().tokens(estimated_tokens).meter(..).call(f)`.
    #[deprecated(
        since = "0.2.0",
        note = "resolve the upstream once and build the request on it: \
                `scheduler.upstream(name)?.request().tokens(estimate).meter(|(_, used): &(_, u64)| *used)\
                .call(f).await.map(|(value, _)| value)` (or let `f` return the reply alone and read its usage \
                with `.meter(|reply: &Reply| ..)`)"
    )]
    pub async fn call_metered<F, Fut, T>(&self, upstream: &str, estimated_tokens: u64, f: F) -> Result<T, Error>
    where
        F: FnMut(Attempt) -> Fut,
        Fut: Future<Output = Result<(T, u64), Outcome>>,
    {
        let request = self.request(upstream)?.tokens(estimated_tokens).meter(|(_, used): &(T, u64)| *used);
        request.call(f).await.map(|(value, _)| value).map_err(Error::without_source)
    }

    /// A permit for one call that the caller makes itself; report the outcome on it.
    /// Waits at most the upstream's `max_wait`. A shorthand for `request().acquire()`.
    #[deprecated(
        since = "0.2.0",
        note = "resolve the upstream once and build the request on it: \
                `scheduler.upstream(name)?.request().acquire().await`"
    )]
    pub async fn acquire(&self, upstream: &str) -> Result<Permit, Error> {
        #[allow(deprecated)]
        self.acquire_tokens(upstream, 0).await
    }

    /// A permit that reserves `estimated_tokens` of the upstream's tokens budget; settle the
    /// real usage with [`Permit::report_usage`]. A shorthand for
    /// `request().tokens(estimated_tokens).acquire()`.
    #[deprecated(
        since = "0.2.0",
        note = "resolve the upstream once and build the request on it: \
                `scheduler.upstream(name)?.request().tokens(estimate).acquire().await`"
    )]
    pub async fn acquire_tokens(&self, upstream: &str, estimated_tokens: u64) -> Result<Permit, Error> {
        self.request(upstream)?.tokens(estimated_tokens).acquire().await
    }

    /// The upstream's state as this process sees it.
    #[deprecated(since = "0.2.0", note = "ask the upstream's handle: `scheduler.upstream(name)?.status().await`")]
    pub async fn status(&self, upstream: &str) -> Result<UpstreamStatus, Error> {
        self.inner.status(self.index(upstream)?).await
    }

    /// The status of every upstream, in configuration order.
    pub async fn statuses(&self) -> Result<Vec<UpstreamStatus>, Error> {
        let mut all = Vec::with_capacity(self.inner.upstreams.len());
        for index in 0..self.inner.upstreams.len() {
            all.push(self.inner.status(index).await?);
        }
        Ok(all)
    }

    /// Every upstream's history over the last minutes, in configuration order: one
    /// [`Sample`](crate::history::Sample) a second (the limit, permits in flight, callers
    /// waiting, grants and their waits, 429s, mode and state) and the changes of mode and state,
    /// as this process saw them. Kept in process and bounded (see [`history`](crate::history));
    /// reading it sends nothing to the shared store and does not wait for the actors.
    ///
    /// ```
    /// # use wavegate::{Scheduler, UpstreamConfig};
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let scheduler = Scheduler::builder().upstream(UpstreamConfig::builder("llm").limit(4).build()?).build()?;
    /// # tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    /// // A first sample is taken as the scheduler starts, then one a second.
    /// let llm = &scheduler.history()[0];
    /// assert_eq!(llm.upstream, "llm");
    /// assert_eq!(llm.samples.last().map(|s| s.limit), Some(4));
    /// # Ok(()) }
    /// ```
    pub fn history(&self) -> Vec<UpstreamHistory> {
        self.inner
            .history
            .iter()
            .zip(&self.inner.upstreams)
            .map(|(ring, config)| ring.read(config.name().as_str()))
            .collect()
    }

    /// How many processes of the fleet are live (their heartbeat in the shared store within
    /// the last 30 s), as this process's last heartbeat learned (no Redis round trip); `None`
    /// in local mode or before the first heartbeat.
    pub async fn live_processes(&self) -> Result<Option<u32>, Error> {
        self.inner.engine.live_processes().await
    }

    /// Waits until the releases already on their way to the shared store have their replies,
    /// at most 1 s more; at once in local mode or with none on their way.
    ///
    /// Call it before the process exits when the actors run on an actix arbiter of yours
    /// (`#[actix::main]`, actix-web's workers): there the last handle's drop cannot block the
    /// arbiter to wait, so a release sent just before the system stops would be lost and its
    /// permit would hold a slot of the fleet's limit until its lease ends. (Without an actix
    /// system the actors have their own thread and the last handle's drop waits by itself.)
    /// Drop or finish the permits first: a permit still held is not released by this. The
    /// scheduler stays usable afterwards.
    ///
    /// ```no_run
    /// # async fn run(scheduler: wavegate::Scheduler) {
    /// // ... the last calls are done ...
    /// scheduler.shutdown().await;
    /// # }
    /// ```
    pub async fn shutdown(&self) {
        // Queued behind the releases this process's permits already sent (one mailbox a lane).
        self.inner.engine.drain().await;
    }

    /// Where permits come from now, for the process: the least shared of its upstreams' modes.
    /// [`Mode::Shared`] only when every upstream shares; [`Mode::Fallback`] (or
    /// [`Mode::Rejected`]) as soon as one is in fallback — on a single Redis all of them switch
    /// together, on a Cluster only the upstreams of a lost master do (see
    /// [`Upstream::mode`]).
    pub async fn mode(&self) -> Result<Mode, Error> {
        self.inner.engine.mode(None).await
    }

    /// Where `upstream`'s permits come from now (no Redis round trip).
    #[deprecated(since = "0.2.0", note = "ask the upstream's handle: `scheduler.upstream(name)?.mode().await`")]
    pub async fn upstream_mode(&self, upstream: &str) -> Result<Mode, Error> {
        self.upstream(upstream)?.mode().await
    }

    /// What the scheduler knows about its shared store (`None` in local mode): how it is found,
    /// the key prefix, the server's version, a rejection of the credentials or ACL rights now
    /// in force, upstreams another process shares with a different configuration.
    #[cfg(feature = "redis")]
    pub fn store_health(&self) -> Option<StoreHealth> {
        self.inner.store.as_ref().map(Store::health)
    }

    /// The handle of pool `name` (see [`Pool`]), resolved once.
    pub fn pool(&self, name: &str) -> Result<Pool, UnknownUpstream> {
        Pool::find(&self.inner, name)
    }

    /// Lifts the refusal a spent quota put on `upstream` in this process (an operator's reset,
    /// e.g. after paying the bill); says whether there was one. See
    /// [`Upstream::reset_quota`].
    #[deprecated(since = "0.2.0", note = "ask the upstream's handle: `scheduler.upstream(name)?.reset_quota()`")]
    pub fn reset_quota(&self, upstream: &str) -> Result<bool, UnknownUpstream> {
        Ok(self.upstream(upstream)?.reset_quota())
    }

    /// The configured upstreams.
    pub fn upstreams(&self) -> impl Iterator<Item = &UpstreamConfig> {
        self.inner.upstreams.iter()
    }
}

/// The namespace of a scheduler that names none (the default Redis key prefix too).
const DEFAULT_NAMESPACE: &str = "wavegate";

/// Builds a [`Scheduler`].
#[derive(Debug)]
#[must_use = "call `build()` to start the scheduler"]
pub struct SchedulerBuilder {
    upstreams: Vec<UpstreamConfig>,
    pools: Vec<PoolConfig>,
    #[cfg(feature = "redis")]
    store: Option<StoreConfig>,
    /// The key prefix: the namespace of the upstreams' shared state (in Redis, and between
    /// the local schedulers of one process).
    namespace: Option<String>,
}

impl SchedulerBuilder {
    /// Adds an upstream.
    pub fn upstream(mut self, upstream: UpstreamConfig) -> Self {
        self.upstreams.push(upstream);
        self
    }

    /// Adds a pool over configured upstreams (its members); see [`Pool`].
    pub fn pool(mut self, pool: PoolConfig) -> Self {
        self.pools.push(pool);
        self
    }

    /// Shares permits and waves across processes through Redis at `url` (feature `redis`)
    /// (default timeouts: 250 ms per command, 500 ms to connect).
    #[cfg(feature = "redis")]
    pub fn redis(self, url: impl Into<String>) -> Self {
        self.store(StoreConfig::new(url))
    }

    /// Shares permits and waves through the Redis primary that the sentinels at `sentinels`
    /// (`host:port`) monitor as `master`, found again after each failover (default timeouts;
    /// for credentials or a database use [`store`](Self::store) with
    /// [`StoreConfig::sentinel`]).
    #[cfg(feature = "redis")]
    pub fn redis_sentinel(
        self,
        master: impl Into<String>,
        sentinels: impl IntoIterator<Item = impl Into<String>>,
    ) -> Self {
        let sentinels = sentinels.into_iter().map(Into::into).collect();
        self.store(StoreConfig::sentinel("redis://sentinel-managed/", master, sentinels))
    }

    /// Shares permits and waves through a Redis Cluster whose nodes include `nodes`
    /// (`redis://host:port/`, credentials in the URLs; feature `cluster`): each upstream's keys
    /// live on the master of its hash tag's slot; redirects are followed by the client.
    #[cfg(feature = "redis")]
    pub fn redis_cluster(self, nodes: impl IntoIterator<Item = impl Into<String>>) -> Self {
        self.store(StoreConfig::cluster(nodes.into_iter().map(Into::into).collect()))
    }

    /// Shares permits and waves through Redis, with explicit timeouts and key namespace.
    #[cfg(feature = "redis")]
    pub fn store(mut self, config: StoreConfig) -> Self {
        self.store = Some(config);
        self
    }

    /// The namespace of the upstreams' shared state (default `wavegate`): the prefix of every
    /// Redis key and channel, and in local mode what the schedulers of one process share. Two
    /// schedulers that name an upstream alike in one namespace share its limit, its wave and
    /// its budgets — across processes through Redis, within a process in local mode (so a
    /// scheduler built per actix-web worker does not multiply the limit). Give each
    /// application (or each test that builds its own scheduler) its own to keep them apart.
    /// Applies to the Redis configured before or after it.
    pub fn key_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.namespace = Some(prefix.into());
        self
    }

    /// Checks the configuration and starts the actors: on the current thread's actix
    /// arbiter if there is one (actix-web, `#[actix::main]`), else on a thread of their own
    /// (any other tokio runtime, or none). Never panics; build once per process and clone.
    ///
    /// With Redis it first checks the server (bounded by the store's timeouts, a few commands
    /// per upstream): a wrong password, missing ACL rights or a server older than 6.2 fail
    /// with [`BuildError::Rejected`]; a server out of reach does not (the calls fail open).
    #[cfg_attr(not(feature = "redis"), allow(unused_mut))]
    pub fn build(mut self) -> Result<Scheduler, BuildError> {
        let set = UpstreamSet::new(self.upstreams.clone())?;
        let mut pools = Vec::with_capacity(self.pools.len());
        for pool in self.pools {
            pool.check_against(&set)?;
            if pools.iter().any(|p: &PoolSlot| p.config.name() == pool.name()) {
                return Err(PoolConfigError::DuplicatePool(pool.name().to_string()).into());
            }
            let members = pool
                .members()
                .iter()
                .map(|(name, _)| self.upstreams.iter().position(|u| u.name() == name).unwrap_or_default())
                .collect();
            pools.push(PoolSlot::new(pool, members, self.upstreams.len()));
        }
        #[cfg(feature = "redis")]
        if let (Some(store), Some(namespace)) = (self.store.as_mut(), &self.namespace) {
            store.keyspace = Keyspace::new(namespace.clone());
        }
        #[cfg(feature = "redis")]
        let store = self.store.map(Store::connect_lazy).transpose()?;
        #[cfg(not(feature = "redis"))]
        let store: Option<Store> = None;
        let instance = Instance::random();
        #[cfg(feature = "redis")]
        let live = match &store {
            Some(store) => crate::startup_check::check_store(store, &self.upstreams, &instance)?,
            None => None,
        };
        #[cfg(not(feature = "redis"))]
        let live = None;
        let health = store.clone();
        let local = store.is_none();
        let quota: Vec<_> = self.upstreams.iter().map(|_| Arc::default()).collect();
        let history: Vec<_> = self.upstreams.iter().map(|_| Arc::default()).collect();
        let membership: Vec<_> = self.upstreams.iter().map(|_| Arc::default()).collect();
        // In local mode the schedulers of this process that name an upstream in one namespace
        // share its in-process gate.
        let namespace = local.then(|| self.namespace.as_deref().unwrap_or(DEFAULT_NAMESPACE));
        let shared = Shared { quotas: &quota, histories: &history, membership: &membership };
        let engine =
            Engine::start(&self.upstreams, store, namespace, shared, (instance, live)).map_err(BuildError::Runtime)?;
        let registration = local.then(|| Registration::new(self.upstreams.iter().map(|u| u.name().to_string())));
        let names = self.upstreams.iter().map(|u| Arc::from(u.name().as_str())).collect();
        let inner = Inner {
            upstreams: self.upstreams,
            names,
            set,
            engine,
            quota,
            history,
            membership,
            pools,
            registration,
            store: health,
        };
        Ok(Scheduler { inner: Arc::new(inner) })
    }
}
