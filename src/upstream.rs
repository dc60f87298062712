//! A handle per upstream.
//!
//! [`Scheduler::upstream`](crate::Scheduler::upstream) resolves a name once and gives an
//! [`Upstream`]: cheap to clone, `Send + Sync`, no lookup per call. Every request starts with
//! [`Upstream::request`] and says what it needs — an estimate of tokens, a deadline, how its
//! result is classified — and ends with [`call`](RequestBuilder::call) (wavegate runs the
//! whole policy around the caller's closure) or [`acquire`](RequestBuilder::acquire) (a
//! [`Permit`](crate::Permit) for a caller that makes the call itself); see [`RequestBuilder`].
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

use std::sync::Arc;
use std::time::Duration;

use wavegate_core::{LiveChange, LiveError, LiveSetting, UpstreamConfig};

use crate::error::Error;
use crate::handle::Inner;
use crate::request_builder::{RequestBuilder, ToUpstream};
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
        RequestBuilder::new(&self.inner, ToUpstream(self.index))
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

    /// Forgets the provider's windows kept for the upstream ("0 left until T", from a header,
    /// a body or a `Retry-After`): in shared mode for the whole fleet (every process looks at
    /// the shared window again within about a second and admits), in local mode for the
    /// process. For a window a broken answer set; logged as a warning.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::StoreUnavailable`](crate::ErrorKind::StoreUnavailable) when the shared
    /// store did not answer (this process's own gate is cleared anyway),
    /// [`ErrorKind::Stopped`](crate::ErrorKind::Stopped) when the scheduler stopped.
    pub async fn clear_window(&self) -> Result<(), Error> {
        self.inner.engine.clear_windows(self.index).await
    }

    /// Sets the upstream's concurrency limit while it runs, until changed again: in shared
    /// mode for the whole fleet (stored in Redis with a version; every process applies it
    /// within about a second, and one started later starts with it), in local mode for this
    /// process's schedulers of the upstream. Answers the new version. Permits held above a
    /// lowered limit run to their end; nobody is admitted until fewer are held. What the 429
    /// wave learned below the new limit is kept (see
    /// [`WaveMachine::rebase`](wavegate_core::WaveMachine::rebase)). Logged once per process
    /// with its version. See `docs/operations.md` (Live changes).
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidSetting`](crate::ErrorKind::InvalidSetting) for a limit of 0;
    /// [`ErrorKind::StoreUnavailable`](crate::ErrorKind::StoreUnavailable) when the shared
    /// store did not answer or the upstream is in fallback (nothing changed);
    /// [`ErrorKind::Stopped`](crate::ErrorKind::Stopped) when the scheduler stopped.
    pub async fn set_limit(&self, limit: u32) -> Result<u64, Error> {
        self.change(LiveChange::set(LiveSetting::Limit, u64::from(limit), None)).await
    }

    /// Sets the upstream's concurrency limit for `ttl` only (an override): when it runs out,
    /// every process goes back to its configured limit (the first look after its end reverts
    /// it in the store, under a new version). Otherwise as [`set_limit`](Self::set_limit).
    ///
    /// # Errors
    ///
    /// As [`set_limit`](Self::set_limit); also
    /// [`ErrorKind::InvalidSetting`](crate::ErrorKind::InvalidSetting) for a `ttl` under 1 ms or
    /// over 7 days.
    pub async fn override_limit(&self, limit: u32, ttl: Duration) -> Result<u64, Error> {
        self.change(LiveChange::set(LiveSetting::Limit, u64::from(limit), Some(ttl))).await
    }

    /// Drops a live limit: every process goes back to its configured one. Answers the new
    /// version.
    ///
    /// # Errors
    ///
    /// As [`set_limit`](Self::set_limit).
    pub async fn clear_limit(&self) -> Result<u64, Error> {
        self.change(Ok(LiveChange::Clear(LiveSetting::Limit))).await
    }

    /// Switches shadow mode on or off for the whole upstream, fleet-wide, until changed (see
    /// [`UpstreamConfigBuilder::shadow`](crate::config::UpstreamConfigBuilder::shadow)): in
    /// shadow no call is held back, and what the policy would have done is recorded in
    /// [`UpstreamStatus::shadow`](crate::UpstreamStatus::shadow) and the
    /// `wavegate_shadow_*` metrics. For a time only, or for one priority class, use
    /// [`change_live`](Self::change_live) with [`LiveChange::shadow`] or
    /// [`LiveChange::set_class`] and [`ClassSetting::Shadow`](crate::ClassSetting::Shadow).
    /// Answers the new version.
    ///
    /// # Errors
    ///
    /// As [`set_limit`](Self::set_limit).
    pub async fn set_shadow(&self, on: bool) -> Result<u64, Error> {
        self.change(LiveChange::shadow(on, None)).await
    }

    /// Any live change (see [`LiveSetting`]: the limit, the rate of the requests or tokens
    /// budget), built with [`LiveChange::set`] (a value, with a time to live for an override)
    /// or [`LiveChange::Clear`] (back to the configured value). A live rate changes the rate
    /// of a budget the upstream is configured with (its burst stays); each budget keeps the
    /// units it holds across the change: it is neither reset nor given a second burst. Answers
    /// the new version. Otherwise as [`set_limit`](Self::set_limit).
    ///
    /// ```
    /// use std::time::Duration;
    /// use wavegate::{LiveChange, LiveSetting, Scheduler, UpstreamConfig};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let scheduler = Scheduler::builder()
    ///     .upstream(UpstreamConfig::builder("llm").requests_per_minute(600, 20).build()?)
    ///     .build()?;
    /// let llm = scheduler.upstream("llm")?;
    /// let half = LiveChange::set(LiveSetting::RequestsPerMinute, 300, Some(Duration::from_secs(600)))?;
    /// assert_eq!(llm.change_live(half).await?, 1);
    /// assert_eq!(llm.status().await?.live_version, 1);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`set_limit`](Self::set_limit); also
    /// [`ErrorKind::InvalidSetting`](crate::ErrorKind::InvalidSetting) for the rate of a budget
    /// the upstream is not configured with.
    pub async fn change_live(&self, change: LiveChange) -> Result<u64, Error> {
        self.change(Ok(change)).await
    }

    async fn change(&self, change: Result<LiveChange, LiveError>) -> Result<u64, Error> {
        let change = change.map_err(|error| Error::invalid_setting(self.name(), error))?;
        self.inner.engine.change_live(self.index, change).await
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
