//! The parts of a configuration: what [`UpstreamConfig::builder`](crate::UpstreamConfig::builder)
//! and [`PoolConfig::builder`](crate::PoolConfig::builder) build, take and refuse.
//!
//! Most programs name only [`UpstreamConfig`](crate::UpstreamConfig) and
//! [`PoolConfig`](crate::PoolConfig) (at the crate root) and chain their builders' setters; the
//! types here are the setters' arguments ([`Backoff`], [`BreakerConfig`], [`Recovery`], ...),
//! the getters' answers ([`WaveConfig`], [`Budgets`], [`PriorityClass`], ...) and the errors
//! of `build()` ([`ConfigError`], [`PoolConfigError`]).
//!
//! ```
//! use std::time::Duration;
//! use wavegate::config::{Backoff, ConfigError, PoolPolicy, Recovery};
//! use wavegate::{PoolConfig, UpstreamConfig};
//!
//! let llm = UpstreamConfig::builder("llm")
//!     .limit(8)
//!     .recovery(Recovery::Seed)
//!     .backoff(Backoff { max_retries: 2, ..Backoff::default() })
//!     .build()?;
//! assert_eq!(llm.backoff().max_retries, 2);
//! let pool = PoolConfig::builder("keys").member("llm", 1).policy(PoolPolicy::default()).build();
//! assert!(pool.is_ok());
//! let refused = UpstreamConfig::builder("llm").limit(0).build();
//! assert!(matches!(refused, Err(ConfigError::ZeroLimit { .. })), "{refused:?}");
//! # let _ = Duration::ZERO;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub use wavegate_core::priority::PriorityClass;
pub use wavegate_core::{
    Backoff, BreakerConfig, Budgets, ConfigError, CooldownPolicy, PoolConfigBuilder, PoolConfigError, PoolPolicy,
    RateBudget, Recovery, RetryBudgetConfig, UpstreamConfigBuilder, UpstreamName, WaveConfig,
};
