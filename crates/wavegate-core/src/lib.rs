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
//! | permits by client id with leases; the in-process twin of the scripts | [`PermitLedger`], [`LocalGate`] |
//! | what a process asks a gate for, and its answer | [`Ask`], [`Decision`], [`PermitId`] |
//! | what a result means, and which layer owns it | [`Outcome`] |
//! | what the provider says: rate-limit headers, kinds of 429 | [`ProviderSignals`], [`RateLimitKind`] |
//! | the provider's windows as the fleet keeps them ("R left until T") | [`ProviderWindows`] |
//! | pools of keys or deployments: which member takes a request | [`PoolConfig`], [`PoolPolicy`] |
//! | circuit breaker | [`CircuitBreaker`] |
//! | retry budget and backoff | [`RetryBudget`], [`Backoff`] |
//! | requests and tokens per minute (GCRA with a cost) | [`Gcra`], [`Budgets`] |
//! | deadlines refused early: what a gate proves about the earliest grant | [`Hold`], [`HeardDenial`], [`LocalGate::proven_hold`] |
//! | priority classes: which waiting class a free permit goes to | [`priority`] |
//! | settings changed while the fleet runs, with versions and overrides | [`LiveBoard`], [`LiveChange`] |
//! | configuration, validated at build time | [`UpstreamConfig`], [`UpstreamSet`] |
//!
//! ```
//! use wavegate_core::{Ask, Decision, Instance, LocalGate, PermitId, UpstreamConfig, WaveSignal, WaveState};
//!
//! let config = UpstreamConfig::builder("images").limit(10).build()?;
//! let mut gate = LocalGate::for_upstream(&config);
//! let lease = config.permit_ttl().as_millis() as u64;
//! let me = Instance::new("worker-1").unwrap();
//! let ask = |n| [Ask { id: PermitId::new(None, &me, n, None), tokens: 0, output: 0, waiting: 1 }];
//!
//! let Decision::Granted { id, wave, .. } = gate.acquire(&me, &ask(1), lease, 0) else { unreachable!() };
//! // The first 429: the limit steps back by half; nobody else stops.
//! gate.finish(&id, wave, WaveSignal::RateLimited { retry_after: None }, 0, 10);
//! let (status, in_flight) = gate.status(10);
//! assert_eq!((status.state, status.limit, in_flight), (WaveState::Degraded, 5, 0));
//! let Decision::Granted { id, wave, .. } = gate.acquire(&me, &ask(2), lease, 10) else { unreachable!() };
//! // Another 429 before any call succeeded at 5: a burst; the whole fleet cools down.
//! gate.finish(&id, wave, WaveSignal::RateLimited { retry_after: None }, 0, 20);
//! let (status, _) = gate.status(20);
//! assert_eq!((status.state, status.limit), (WaveState::Cooldown, 2));
//! # Ok::<(), wavegate_core::ConfigError>(())
//! ```

mod ask;
mod backoff;
mod breaker;
mod budget_turn;
mod charge_start;
pub mod class_budget;
mod clock;
mod config;
mod cooldown;
mod deadline;
mod gate;
mod gcra;
mod learned_limit;
mod ledger;
mod live;
mod outage_usage;
mod outcome;
mod permit_id;
mod pool;
pub mod priority;
mod provider_window;
mod rate_limit_kind;
mod retry_after;
mod retry_budget;
mod served_spans;
mod shadow;
mod signals;
#[cfg(feature = "spec")]
pub mod spec;
#[cfg(feature = "sse")]
mod sse_usage;
pub mod tenant;
mod token_delta;
mod wave;

pub use ask::{Ask, Decision};
pub use backoff::Backoff;
pub use breaker::{
    BreakerConfig, BreakerOpen, BreakerState, BreakerTicket, BreakerTransition, CallResult, CircuitBreaker,
};
pub use budget_turn::{BudgetTurn, TURN_GRACE_MS, TURN_HORIZON_MS, TURN_MOST, TURN_STEP_MS};
pub use charge_start::ChargeStart;
pub use clock::{Clock, ManualClock, MonotonicClock, duration_ms};
pub use config::{
    CLASS_RENEWAL_EVERY, ConfigError, MAX_PER_DAY, UnknownUpstream, UpstreamConfig, UpstreamConfigBuilder,
    UpstreamName, UpstreamSet,
};
pub use cooldown::CooldownPolicy;
pub use deadline::{HeardDenial, Hold};
pub use gate::{
    BudgetStatus, DayLeft, Fallback, FallbackStart, FinishReport, LastShared, LocalGate, PRIORITY_FRESH_MS,
    WAITING_TTL_MS, WaveSignal,
};
pub use gcra::{Budgets, DAY_MOST_DEBT_US, DayBudget, Gcra, RateBudget, rescale_tat};
pub use learned_limit::{
    KEPT_WINDOWS, KeptLimit, LearnedBudgets, LearnedLimit, LearnedLimitStatus, LearnedLimits, LearnedStatus, tightest,
};
pub use ledger::{HeldPermit, PermitLedger};
pub use live::{
    ClassLive, ClassSetting, LiveBoard, LiveChange, LiveError, LiveSetting, LiveSettings, LiveStamp, LiveValue,
    QUOTA_SPENT,
};
pub use outage_usage::OutageUsage;
pub use outcome::{Outcome, Transient, TransportError};
pub use permit_id::{BadPermitId, Instance, PermitId, TenantTag};
pub use pool::{MemberView, PoolConfig, PoolConfigBuilder, PoolConfigError, PoolPolicy};
pub use provider_window::{
    MAX_WINDOW_LEFT, MAX_WINDOW_MS, ProviderWindows, SAME_WINDOW_MS, SentCount, TrackedWindow, WindowLeft, WindowReport,
};
pub use rate_limit_kind::RateLimitKind;
pub use retry_after::{RetryAfterError, parse_retry_after};
pub use retry_budget::{RetryBudget, RetryBudgetConfig};
pub use served_spans::{
    SERVED_SPANS_AHEAD_MS, SERVED_SPANS_KEEP_MS, SERVED_SPANS_MAX, SPAN_MARGIN_MS, ServedSpan, ServedSpans,
};
pub use shadow::ShadowScope;
pub use signals::{DOCUMENTED_PERIOD, MAX_RESET, ProviderSignals, REFILL_SLACK, SignalKind, Unreadable, Window};
#[cfg(feature = "sse")]
pub use sse_usage::{SseUsage, StreamUsage, UsageUpdate, usage_of_event};
pub use token_delta::{TokenDelta, WindowsBack};
pub use wave::{
    Admission, DenyReason, RateLimitEffect, Recovery, Transition, WaveConfig, WaveMachine, WaveSnapshot, WaveState,
};

// Re-exported so callers can name the RNG trait the backoff takes without a direct dependency.
pub use rand;
