//! wavegate schedules calls to rate-limited APIs (providers that answer HTTP 429) from a fleet
//! of worker processes: one shared concurrency limit, one shared 429 "wave" per upstream, a
//! circuit breaker and a retry budget per upstream.
//!
//! It is actor-based (actix):
//! * a **coordinator** owns the Redis connection and every upstream's permits; one acquire
//!   loop per upstream serves this process's waiters earliest deadline first (arrival order
//!   for callers without a deadline of their own), a release anywhere wakes
//!   them (pub/sub), a lease watchdog renews held permits;
//! * a **supervisor** per upstream runs its circuit breaker and retry budget;
//! * a **call** goes admission → permit → the caller's future → report → retry or answer; it
//!   is a future polled in the caller's own task (the actors answer its messages), so the
//!   caller's closure may borrow and its error type comes back untouched ([`Error<E>`],
//!   [`classify`]).
//!
//! The actors run on the caller's actix system when there is one (actix-web), and on a thread
//! of their own otherwise (any tokio runtime: axum, `#[tokio::main]`, `#[tokio::test]`).
//! Requests are built on a handle per upstream: `scheduler.upstream("llm")?.request()
//! .tokens(..).deadline(..).call(..)` or `.acquire()` ([`Upstream`], [`RequestBuilder`]).
//!
//! With no Redis configured, the same API runs in-process (local mode, the embedded default).
//!
//! Every type the API uses is named here, so an application depends on `wavegate` alone:
//! * the root holds what programs name: the [`Scheduler`] and its handles ([`Upstream`],
//!   [`Pool`], [`Permit`]), [`UpstreamConfig`] and [`PoolConfig`], the [`Error`] (one struct
//!   with an [`ErrorKind`]), the [`Outcome`] of a call and how a result becomes one
//!   ([`classify`]), the status ([`UpstreamStatus`], [`Mode`]) and, with Redis, the store's
//!   configuration and health (`StoreConfig`, `StoreHealth`);
//! * [`config`] holds the parts of a configuration (builders, their arguments, their errors);
//! * [`history`] holds each upstream's last minutes as this process saw them, one sample a
//!   second (`Scheduler::history`, for a live status page such as `wavegate-web`'s);
//! * [`dev`] holds the lower-level types that the values above are made of, for libraries
//!   built on wavegate.
//!
//! The policy itself (wave machine, breaker, budgets) lives in the `wavegate-core` crate, which
//! applications need not depend on.
//!
//! The guide, every example in it a doc test, is [`_guide`]; the guarantees and their bounds
//! are in `docs/guarantees.md`.
//!
//! Cargo features (all but `redis` off by default), each built alone in CI:
//! * `redis` (default) — shared mode through Redis ([`SchedulerBuilder::redis`]); without it
//!   the scheduler is local-only and redis is not compiled;
//! * `http` — `Outcome::from_response` / `from_head` and the [`ByStatus`] classifier for
//!   `http::Response`;
//! * `reqwest` — [`ByStatus`] for `reqwest::Response` (reqwest 0.13) and [`UpstreamError`] for
//!   `reqwest::Error`;
//! * `reqwest-middleware` — `middleware::reqwest::WavegateMiddleware`, a `reqwest-middleware`
//!   middleware;
//! * `tower` — `middleware::tower::WavegateLayer`, a tower `Layer` (with `http`, its
//!   `hold_bodies` keeps a streamed response's permit until its body ends);
//! * `sse` — `SseUsage`: the usage a streamed answer reports in its server-sent events (OpenAI,
//!   Anthropic), a [`StreamMeter`] for [`RequestBuilder::call_stream`] (`reqwest-middleware`
//!   turns it on);
//! * `config` — `settings::Settings`: the configuration from TOML and the environment
//!   (`WAVEGATE__UPSTREAMS__LLM__LIMIT=10`), with the builders' validation;
//! * `tls` — `rediss://` Redis URLs (rustls with the ring provider; the system's roots or
//!   [`StoreConfig::root_certificate`]);
//! * `cluster` — Redis Cluster ([`SchedulerBuilder::redis_cluster`]), through redis-rs's async
//!   cluster client.
//!
//! Redis as it is deployed (Sentinel, TLS, ACL users, key prefixes) is described in
//! `docs/redis.md`.
//!
//! ```
//! use std::time::Duration;
//! use wavegate::{ErrorKind, Outcome, Scheduler, UpstreamConfig};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let scheduler = Scheduler::builder()
//!     .upstream(UpstreamConfig::builder("images").limit(2).max_wait(Duration::from_millis(50)).build()?)
//!     .build()?;
//! let images = scheduler.upstream("images")?;
//!
//! // Drive the HTTP call yourself with a permit guard...
//! let first = images.request().acquire().await?;
//! let second = images.request().acquire().await?;
//! // ...the limit is 2, so a third caller waits and gives up after max_wait.
//! let refused = images.request().acquire().await.unwrap_err();
//! assert_eq!(refused.kind(), ErrorKind::WaitedTooLong);
//! first.report(Outcome::from_status(200, None, std::time::SystemTime::now()));
//! drop(second); // released as a neutral outcome
//! assert!(images.request().acquire().await.is_ok());
//! // A name that is not configured is refused when it is resolved.
//! let unknown = scheduler.upstream("nope").unwrap_err();
//! assert_eq!(unknown.name, "nope");
//! # Ok(()) }
//! ```

mod attempt;
mod build_error;
mod call;
pub mod classify;
pub mod config;
pub mod dev;
mod engine;
mod error;
mod error_kind;
mod handle;
mod held;
pub mod history;
pub mod metrics;
pub mod middleware;
mod permit;
mod pool;
mod pool_membership;
mod provider_signals;
mod quota;
mod registry;
mod request_builder;
mod scheduler;
mod served;
#[cfg(feature = "config")]
pub mod settings;
mod shadow;
#[cfg(feature = "redis")]
mod startup_check;
mod status;
pub mod stream;
mod upstream;

// The scheduler and its handles.
pub use attempt::Attempt;
pub use build_error::BuildError;
pub use permit::Permit;
pub use pool::Pool;
pub use request_builder::RequestBuilder;
pub use scheduler::{Scheduler, SchedulerBuilder};
pub use upstream::Upstream;
// What a request ends with.
pub use classify::{ByError, ByStatus, Classify, Meter, Reserved, UpstreamError};
pub use error::{Budget, Error, ErrorKind};
pub use stream::{HeldStream, StreamMeter};
pub use wavegate_core::{Outcome, ProviderSignals, RateLimitKind, TransportError, UnknownUpstream};
#[cfg(feature = "sse")]
pub use wavegate_core::{SseUsage, StreamUsage};
// Configuration (its parts are in `config`).
pub use wavegate_core::{PoolConfig, UpstreamConfig};
// Status.
pub use shadow::ShadowStatus;
pub use status::{ClassStatus, Mode, UpstreamStatus};
pub use wavegate_core::{BudgetStatus, LearnedStatus, WaveState};
// Live changes.
pub use wavegate_core::{ClassSetting, LiveChange, LiveError, LiveSetting, ShadowScope};
// The shared store.
#[cfg(feature = "redis")]
pub use wavegate_redis::{Keyspace, Rejection, SentinelConfig, StoreConfig, StoreError, StoreHealth};

#[doc = include_str!("../docs/guide.md")]
pub mod _guide {}

#[doc = include_str!("../README.md")]
#[cfg(doctest)]
struct ReadmeDoctests;
