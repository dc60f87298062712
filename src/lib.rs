//! wavegate schedules calls to rate-limited APIs (providers that answer HTTP 429) from a fleet
//! of worker processes: one shared concurrency limit, one shared 429 "wave" per upstream, a
//! circuit breaker and a retry budget per upstream, and a local fallback when Redis is down.
//!
//! This package is the façade. Today it re-exports the pure policy from [`wavegate_core`]
//! as [`core`]; the actors (coordinator, upstream supervisors, request actors), the
//! `Scheduler` handle and the `Permit` guard are built on it next (see the README's status).
//!
//! ```
//! use wavegate::core::{UpstreamConfig, UpstreamSet};
//!
//! let upstreams = UpstreamSet::new([
//!     UpstreamConfig::builder("openai").limit(20).build()?,
//!     UpstreamConfig::builder("images").limit(4).build()?,
//! ])?;
//! assert_eq!(upstreams.get("images")?.limit().get(), 4);
//! assert!(upstreams.get("anthropic").is_err());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub use wavegate_core as core;

#[doc = include_str!("../README.md")]
#[cfg(doctest)]
struct ReadmeDoctests;
