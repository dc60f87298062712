//! wavegate's policy, with no I/O: what the scheduler decides, separate from how it talks.
//!
//! Everything here is a pure state machine or function; time comes in as milliseconds from a
//! [`Clock`] and randomness as an [`rand::Rng`], so every rule can be tested exactly and the
//! same rules can be reimplemented (in Lua, for Redis) and checked against the tables in
//! `spec` (with the `spec` feature: the tables are test material, not part of the API users
//! build against).
//!
//! | concept | where |
//! |---|---|
//! | the 429 wave: NORMAL / COOLDOWN / PROBE / DEGRADED | [`WaveMachine`] |
//! | cooldown length: `Retry-After`, else the ladder | [`CooldownPolicy`], [`parse_retry_after`] |
//! | permits by client id with leases | [`PermitLedger`], [`LocalGate`] |
//! | what a result means, and which layer owns it | [`Outcome`] |
//! | what the provider says: rate-limit headers, kinds of 429 | [`ProviderSignals`], [`RateLimitKind`] |
//! | the provider's windows as the fleet keeps them ("R left until T") | [`ProviderWindows`] |
//! | pools of keys or deployments: which member takes a request | [`PoolConfig`], [`PoolPolicy`] |
//! | circuit breaker | [`CircuitBreaker`] |
//! | retry budget and backoff | [`RetryBudget`], [`Backoff`] |
//! | requests and tokens per minute (GCRA with a cost) | [`Gcra`], [`Budgets`] |
//! | priority classes: which waiting class a free permit goes to | [`priority`] |
//! | configuration, validated at build time | [`UpstreamConfig`], [`UpstreamSet`] |
//!
//! ```
//! use wavegate_core::{Admission, LocalGate, UpstreamConfig, WaveSignal, WaveState};
//!
//! let config = UpstreamConfig::builder("images").limit(10).build()?;
//! let mut gate = LocalGate::new(config.wave().clone());
//! let lease = config.permit_ttl().as_millis() as u64;
//!
//! let Admission::Granted { wave, .. } = gate.acquire("req-1", 0, lease) else { unreachable!() };
//! // The first 429: the limit steps back by half; nobody else stops.
//! gate.finish("req-1", wave, WaveSignal::RateLimited { retry_after: None }, 10);
//! let (status, in_flight) = gate.status(10);
//! assert_eq!((status.state, status.limit, in_flight), (WaveState::Degraded, 5, 0));
//! let Admission::Granted { wave, .. } = gate.acquire("req-2", 10, lease) else { unreachable!() };
//! // Another 429 before any call succeeded at 5: a burst; the whole fleet cools down.
//! gate.finish("req-2", wave, WaveSignal::RateLimited { retry_after: None }, 20);
//! let (status, _) = gate.status(20);
//! assert_eq!((status.state, status.limit), (WaveState::Cooldown, 2));
//! # Ok::<(), wavegate_core::ConfigError>(())
//! ```

mod ask;
mod backoff;
mod breaker;
pub mod class_budget;
mod clock;
mod config;
mod cooldown;
mod gate;
mod gcra;
mod learned_limit;
mod ledger;
mod outcome;
mod permit_id;
mod pool;
pub mod priority;
mod provider_window;
mod rate_limit_kind;
mod retry_after;
mod retry_budget;
mod signals;
#[cfg(feature = "spec")]
pub mod spec;
pub mod tenant;
mod wave;

pub use ask::{Ask, Decision};
pub use backoff::Backoff;
pub use breaker::{
    BreakerConfig, BreakerOpen, BreakerState, BreakerTicket, BreakerTransition, CallResult, CircuitBreaker,
};
pub use clock::{Clock, ManualClock, MonotonicClock, duration_ms};
pub use config::{
    CLASS_RENEWAL_EVERY, ConfigError, UnknownUpstream, UpstreamConfig, UpstreamConfigBuilder, UpstreamName, UpstreamSet,
};
pub use cooldown::CooldownPolicy;
pub use gate::{BudgetStatus, FinishReport, LocalGate, WaveSignal};
pub use gcra::{Budgets, Gcra, RateBudget};
pub use learned_limit::{
    KEPT_WINDOWS, KeptLimit, LearnedBudgets, LearnedLimit, LearnedLimitStatus, LearnedLimits, LearnedStatus, tightest,
};
pub use ledger::{HeldPermit, PermitLedger};
pub use outcome::{Outcome, Transient, TransportError};
pub use permit_id::{BadPermitId, Instance, PermitId, TenantTag};
pub use pool::{MemberView, PoolConfig, PoolConfigBuilder, PoolConfigError, PoolPolicy};
pub use provider_window::{ProviderWindows, SAME_WINDOW_MS, TrackedWindow, WindowLeft, WindowReport};
pub use rate_limit_kind::RateLimitKind;
pub use retry_after::{RetryAfterError, parse_retry_after};
pub use retry_budget::{RetryBudget, RetryBudgetConfig};
pub use signals::{DOCUMENTED_PERIOD, MAX_RESET, ProviderSignals, SignalKind, Unreadable, Window};
pub use wave::{
    Admission, DenyReason, RateLimitEffect, Recovery, Transition, WaveConfig, WaveMachine, WaveSnapshot, WaveState,
};

// Re-exported so callers can name the RNG trait the backoff takes without a direct dependency.
pub use rand;
