//! The one error type callers see.

use std::time::Duration;

use wavegate_core::{Outcome, UnknownUpstream};

/// Why a call or an acquire did not succeed.
///
/// The overload errors ([`is_overload`](Error::is_overload): waited too long, queue full,
/// breaker open, retry budget spent) mean "the provider is saturated, try later" and carry a
/// [`retry_after`](Error::retry_after) hint for end users (HTTP 503 + `Retry-After`).
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The upstream name is not configured.
    #[error(transparent)]
    UnknownUpstream(#[from] UnknownUpstream),
    /// This process already has as many callers waiting for the upstream as it allows.
    #[error("upstream `{upstream}`: {capacity} callers are already waiting for a permit")]
    QueueFull {
        /// The upstream.
        upstream: String,
        /// The queue's capacity.
        capacity: usize,
    },
    /// No permit came within the longest wait.
    #[error("upstream `{upstream}`: no permit within {waited:?}")]
    WaitedTooLong {
        /// The upstream.
        upstream: String,
        /// How long the caller waited.
        waited: Duration,
        /// When a permit may be available (the rest of a cooldown), if known.
        retry_after: Option<Duration>,
    },
    /// The upstream's circuit breaker is open.
    #[error("upstream `{upstream}`: circuit breaker open")]
    BreakerOpen {
        /// The upstream.
        upstream: String,
        /// When the breaker will let a probe through.
        retry_after: Duration,
    },
    /// A retry was needed but the upstream's retry budget is spent.
    #[error("upstream `{upstream}`: retry budget spent after {attempts} attempts (last: {last})")]
    RetryBudgetSpent {
        /// The upstream.
        upstream: String,
        /// Attempts made.
        attempts: u32,
        /// The outcome of the last attempt (its label).
        last: &'static str,
    },
    /// The call's total time budget ran out.
    #[error("upstream `{upstream}`: deadline passed after {attempts} attempts")]
    DeadlinePassed {
        /// The upstream.
        upstream: String,
        /// Attempts made.
        attempts: u32,
    },
    /// The upstream answered with a failure that is not retried (or no retries were left).
    #[error("upstream `{upstream}` failed ({}) after {attempts} attempts", .outcome.label())]
    Upstream {
        /// The upstream.
        upstream: String,
        /// The last outcome; [`Outcome::status`] gives its HTTP status.
        outcome: Outcome,
        /// Attempts made.
        attempts: u32,
    },
    /// The request can never fit: its token estimate exceeds the tokens-per-minute burst.
    #[error("upstream `{upstream}`: {requested} tokens can never fit a {budget} burst of {burst}")]
    InsufficientCapacity {
        /// The upstream.
        upstream: String,
        /// The budget (`tokens_per_minute`).
        budget: &'static str,
        /// The tokens asked for.
        requested: u64,
        /// The budget's burst.
        burst: u64,
    },
    /// The scheduler's actors are gone (the actix system is shutting down).
    #[error("the scheduler has stopped")]
    Stopped,
}

impl Error {
    /// Whether this is an overload refusal: waited too long, queue full, breaker open, retry
    /// budget spent.
    pub fn is_overload(&self) -> bool {
        matches!(
            self,
            Error::QueueFull { .. }
                | Error::WaitedTooLong { .. }
                | Error::BreakerOpen { .. }
                | Error::RetryBudgetSpent { .. }
        )
    }

    /// A hint for when trying again may work, for overload errors and deadlines.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Error::WaitedTooLong { retry_after, .. } => Some(retry_after.unwrap_or(Duration::from_secs(1))),
            Error::BreakerOpen { retry_after, .. } => Some(*retry_after),
            Error::QueueFull { .. } | Error::RetryBudgetSpent { .. } | Error::DeadlinePassed { .. } => {
                Some(Duration::from_secs(1))
            }
            _ => None,
        }
    }

    /// The HTTP status of an upstream failure.
    pub fn upstream_status(&self) -> Option<u16> {
        match self {
            Error::Upstream { outcome, .. } => outcome.status(),
            _ => None,
        }
    }

    /// A stable snake_case code, for metrics and machine-readable bodies.
    pub const fn code(&self) -> &'static str {
        match self {
            Error::UnknownUpstream(_) => "unknown_upstream",
            Error::QueueFull { .. } => "queue_full",
            Error::WaitedTooLong { .. } => "waited_too_long",
            Error::BreakerOpen { .. } => "breaker_open",
            Error::RetryBudgetSpent { .. } => "retry_budget_spent",
            Error::DeadlinePassed { .. } => "deadline_passed",
            Error::Upstream { .. } => "upstream_error",
            Error::InsufficientCapacity { .. } => "insufficient_capacity",
            Error::Stopped => "stopped",
        }
    }
}
