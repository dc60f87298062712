//! wavegate schedules calls to rate-limited APIs (providers that answer HTTP 429) from a fleet
//! of worker processes: one shared concurrency limit, one shared 429 "wave" per upstream, a
//! circuit breaker and a retry budget per upstream.
//!
//! It is actor-based (actix):
//! * a **coordinator** owns the Redis connection and every upstream's permits; one acquire
//!   loop per upstream serves this process's waiters in FIFO order, a release anywhere wakes
//!   them (pub/sub), a lease watchdog renews held permits;
//! * a **supervisor** per upstream runs its circuit breaker and retry budget;
//! * a **request actor** per call goes admission → permit → call → report → retry or answer.
//!
//! With no Redis configured, the same API runs in-process (local mode, the embedded default).
//! The pure policy (wave machine, breaker, budget, config) is [`core`] (`wavegate-core`).
//!
//! ```
//! use std::time::Duration;
//! use wavegate::{Error, Outcome, Scheduler, UpstreamConfig};
//!
//! # #[actix::main]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let scheduler = Scheduler::builder()
//!     .upstream(UpstreamConfig::builder("images").limit(2).max_wait(Duration::from_millis(50)).build()?)
//!     .build()?;
//!
//! // Drive the HTTP call yourself with a permit guard...
//! let first = scheduler.acquire("images").await?;
//! let second = scheduler.acquire("images").await?;
//! // ...the limit is 2, so a third caller waits and gives up after max_wait.
//! assert!(matches!(scheduler.acquire("images").await, Err(Error::WaitedTooLong { .. })));
//! first.report(Outcome::from_status(200, None, std::time::SystemTime::now()));
//! drop(second); // released as a neutral outcome
//! assert!(scheduler.acquire("images").await.is_ok());
//! assert!(matches!(scheduler.acquire("nope").await, Err(Error::UnknownUpstream(_))));
//! # Ok(()) }
//! ```

mod call;
pub mod classify;
mod coordinator;
mod error;
mod ids;
mod messages;
pub mod metrics;
mod permit;
mod request;
mod runtime;
mod scheduler;
mod status;
mod supervisor;
mod upstream;

pub use classify::{ByError, ByStatus, Classify, Meter, Reserved, UpstreamError};
pub use error::Error;
pub use permit::Permit;
pub use request::Attempt;
pub use scheduler::{BuildError, Scheduler, SchedulerBuilder};
pub use status::{Mode, UpstreamStatus};
pub use upstream::{RequestBuilder, Upstream};
pub use wavegate_core as core;
pub use wavegate_core::{Outcome, TransportError, UpstreamConfig, WaveState};
pub use wavegate_redis::StoreConfig;

#[doc = include_str!("../README.md")]
#[cfg(doctest)]
struct ReadmeDoctests;
