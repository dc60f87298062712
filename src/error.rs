//! The one error type callers see.

use std::convert::Infallible;
use std::fmt;
use std::time::Duration;

use wavegate_core::{Outcome, UnknownUpstream};

/// [`Error::InsufficientCapacity`]'s `budget` in fallback: this process's share of the tokens
/// budget.
pub(crate) const FALLBACK_SHARE: &str = "tokens_per_minute_fallback_share";

/// Why a call or an acquire did not succeed.
///
/// The overload errors ([`is_overload`](Error::is_overload): waited too long, queue full,
/// breaker open, retry budget spent) mean "the provider is saturated, try later" and carry a
/// [`retry_after`](Error::retry_after) hint for end users (HTTP 503 + `Retry-After`).
///
/// `E` is the caller's own error type: a call whose closure fails with `Err(e)` that is not
/// retried (or has no retry left) ends with [`Error::Upstream`] holding `source: Some(e)`,
/// untouched. Everything that has no caller's error (acquire, status) uses the default,
/// `Error<Infallible>`, which is what plain `Error` means; [`without_source`](Error::without_source)
/// turns any `Error<E>` into it.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum Error<E = Infallible> {
    /// The upstream name is not configured.
    UnknownUpstream(UnknownUpstream),
    /// This process already has as many callers waiting for the upstream as it allows.
    QueueFull {
        /// The upstream.
        upstream: String,
        /// The queue's capacity.
        capacity: usize,
    },
    /// No permit came within the longest wait.
    WaitedTooLong {
        /// The upstream.
        upstream: String,
        /// How long the caller waited.
        waited: Duration,
        /// When a permit may be available (the rest of a cooldown), if known.
        retry_after: Option<Duration>,
    },
    /// The upstream's circuit breaker is open.
    BreakerOpen {
        /// The upstream.
        upstream: String,
        /// When the breaker will let a probe through.
        retry_after: Duration,
    },
    /// A retry was needed but the upstream's retry budget is spent.
    RetryBudgetSpent {
        /// The upstream.
        upstream: String,
        /// Attempts made.
        attempts: u32,
        /// The outcome of the last attempt (its label).
        last: &'static str,
    },
    /// The call's total time budget ran out.
    DeadlinePassed {
        /// The upstream.
        upstream: String,
        /// Attempts made.
        attempts: u32,
    },
    /// The upstream answered with a failure that is not retried (or no retries were left).
    Upstream {
        /// The upstream.
        upstream: String,
        /// The last outcome; [`Outcome::status`] gives its HTTP status.
        outcome: Outcome,
        /// Attempts made.
        attempts: u32,
        /// The caller's own error, when the last attempt ended with one (`None` when it timed
        /// out).
        source: Option<E>,
    },
    /// The request can never fit: its token estimate exceeds the tokens-per-minute burst
    /// (refused before any wait). In fallback, the burst is this process's share of it
    /// (`budget` is then `tokens_per_minute_fallback_share`): the estimate fits again once
    /// the shared store is back.
    InsufficientCapacity {
        /// The upstream.
        upstream: String,
        /// The budget: `tokens_per_minute`, or `tokens_per_minute_fallback_share`.
        budget: &'static str,
        /// The tokens asked for.
        requested: u64,
        /// The budget's burst.
        burst: u64,
    },
    /// The provider said the account's quota is exhausted (`insufficient_quota`): a billing
    /// state, not a rate limit. Not retried; the upstream is refused at once in this process
    /// until `retry_after` has passed or an operator calls
    /// [`Scheduler::reset_quota`](crate::Scheduler::reset_quota).
    QuotaExhausted {
        /// The upstream.
        upstream: String,
        /// Attempts made by this call (1 for the call that met the refusal, 0 for the calls
        /// refused after it).
        attempts: u32,
        /// How long the upstream stays refused in this process.
        retry_after: Duration,
    },
    /// The request names a priority class the upstream does not have (refused before any
    /// wait).
    UnknownClass {
        /// The upstream.
        upstream: String,
        /// The class asked for.
        class: String,
        /// The upstream's classes, comma-separated (empty: it has none).
        known: String,
    },
    /// The scheduler's actors are gone (the actix system is shutting down).
    Stopped,
}

impl<E> fmt::Display for Error<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::UnknownUpstream(unknown) => unknown.fmt(f),
            Error::QueueFull { upstream, capacity } => {
                write!(f, "upstream `{upstream}`: {capacity} callers are already waiting for a permit")
            }
            Error::WaitedTooLong { upstream, waited, .. } => {
                write!(f, "upstream `{upstream}`: no permit within {waited:?}")
            }
            Error::BreakerOpen { upstream, .. } => write!(f, "upstream `{upstream}`: circuit breaker open"),
            Error::RetryBudgetSpent { upstream, attempts, last } => {
                write!(f, "upstream `{upstream}`: retry budget spent after {attempts} attempts (last: {last})")
            }
            Error::DeadlinePassed { upstream, attempts } => {
                write!(f, "upstream `{upstream}`: deadline passed after {attempts} attempts")
            }
            Error::Upstream { upstream, outcome, attempts, .. } => {
                write!(f, "upstream `{upstream}` failed ({}) after {attempts} attempts", outcome.label())
            }
            Error::InsufficientCapacity { upstream, requested, budget, burst } if *budget == FALLBACK_SHARE => write!(
                f,
                "upstream `{upstream}`: {requested} tokens do not fit this process's share of the tokens \
                 burst ({burst}) while the shared store is unreachable; they fit once it is back"
            ),
            Error::InsufficientCapacity { upstream, requested, budget, burst } => {
                write!(f, "upstream `{upstream}`: {requested} tokens can never fit a {budget} burst of {burst}")
            }
            Error::QuotaExhausted { upstream, attempts, retry_after } => write!(
                f,
                "upstream `{upstream}`: the provider's quota is exhausted (after {attempts} attempts); refused for \
                 {retry_after:?} or until an operator resets it"
            ),
            Error::UnknownClass { upstream, class, known } if known.is_empty() => write!(
                f,
                "upstream `{upstream}` has no priority classes, so class `{class}` is unknown; add it with \
                 `UpstreamConfig::builder(..).class(name, weight)` or drop `.priority(..)`"
            ),
            Error::UnknownClass { upstream, class, known } => {
                write!(f, "upstream `{upstream}` has no priority class `{class}`; its classes: {known}")
            }
            Error::Stopped => f.write_str("the scheduler has stopped"),
        }
    }
}

impl<E: std::error::Error + 'static> std::error::Error for Error<E> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::UnknownUpstream(unknown) => Some(unknown),
            Error::Upstream { source: Some(source), .. } => Some(source),
            _ => None,
        }
    }
}

impl<E> From<UnknownUpstream> for Error<E> {
    fn from(unknown: UnknownUpstream) -> Self {
        Error::UnknownUpstream(unknown)
    }
}

impl<E> Error<E> {
    /// The caller's own error, if the call ended with one ([`Error::Upstream`]).
    pub fn source_error(&self) -> Option<&E> {
        match self {
            Error::Upstream { source, .. } => source.as_ref(),
            _ => None,
        }
    }

    /// Takes the caller's own error out, if the call ended with one.
    pub fn into_source(self) -> Option<E> {
        match self {
            Error::Upstream { source, .. } => source,
            _ => None,
        }
    }

    /// The same error with the caller's error turned by `f`.
    pub fn map_source<F>(self, f: impl FnOnce(E) -> F) -> Error<F> {
        self.with_source(|source| source.map(f))
    }

    /// The same error without the caller's error (kept in [`Error::Upstream`]'s `outcome`
    /// only): a plain [`Error`], e.g. to render it as a response.
    pub fn without_source(self) -> Error {
        self.with_source(|_| None)
    }

    fn with_source<F>(self, source: impl FnOnce(Option<E>) -> Option<F>) -> Error<F> {
        match self {
            Error::UnknownUpstream(unknown) => Error::UnknownUpstream(unknown),
            Error::QueueFull { upstream, capacity } => Error::QueueFull { upstream, capacity },
            Error::WaitedTooLong { upstream, waited, retry_after } => {
                Error::WaitedTooLong { upstream, waited, retry_after }
            }
            Error::BreakerOpen { upstream, retry_after } => Error::BreakerOpen { upstream, retry_after },
            Error::RetryBudgetSpent { upstream, attempts, last } => {
                Error::RetryBudgetSpent { upstream, attempts, last }
            }
            Error::DeadlinePassed { upstream, attempts } => Error::DeadlinePassed { upstream, attempts },
            Error::Upstream { upstream, outcome, attempts, source: own } => {
                Error::Upstream { upstream, outcome, attempts, source: source(own) }
            }
            Error::InsufficientCapacity { upstream, budget, requested, burst } => {
                Error::InsufficientCapacity { upstream, budget, requested, burst }
            }
            Error::QuotaExhausted { upstream, attempts, retry_after } => {
                Error::QuotaExhausted { upstream, attempts, retry_after }
            }
            Error::UnknownClass { upstream, class, known } => Error::UnknownClass { upstream, class, known },
            Error::Stopped => Error::Stopped,
        }
    }

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
            Error::BreakerOpen { retry_after, .. } | Error::QuotaExhausted { retry_after, .. } => Some(*retry_after),
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
            Error::QuotaExhausted { .. } => "quota_exhausted",
            Error::UnknownClass { .. } => "unknown_class",
            Error::Stopped => "stopped",
        }
    }
}
