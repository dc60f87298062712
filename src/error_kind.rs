//! What kind of error an `Error` is, and the tokens budget an estimate can never fit.

use std::fmt;

/// What kind of error an [`Error`](crate::Error) is.
///
/// New kinds may be added: match with a wildcard arm.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The upstream (or pool) name is not configured.
    UnknownUpstream,
    /// This process already has as many callers waiting for the upstream as it allows
    /// ([`queue_capacity`](crate::Error::queue_capacity)).
    QueueFull,
    /// No permit came within the longest wait ([`waited`](crate::Error::waited)), or none
    /// could: a cooldown the upstream is in ends after it, and the caller is told at once
    /// ([`retry_after`](crate::Error::retry_after): when it ends).
    WaitedTooLong,
    /// The upstream's circuit breaker is open.
    BreakerOpen,
    /// A retry was needed but the upstream's retry budget is spent.
    RetryBudgetSpent,
    /// The request's deadline (or the upstream's total timeout) passed, or no permit could
    /// come before it (told at once, with [`retry_after`](crate::Error::retry_after)).
    DeadlinePassed,
    /// The upstream answered with a failure that is not retried (or no retries were left),
    /// or its last attempt ran past the call timeout: see [`outcome`](crate::Error::outcome) and
    /// [`source_error`](crate::Error::source_error).
    Upstream,
    /// The request can never fit: its token estimate exceeds the burst of a tokens budget
    /// ([`budget`](crate::Error::budget)); refused before any wait.
    InsufficientCapacity,
    /// The provider said the account's quota is exhausted (`insufficient_quota`): a billing
    /// state, not a rate limit. Not retried; the upstream is refused at once in this process
    /// until [`retry_after`](crate::Error::retry_after) has passed or an operator calls
    /// [`Upstream::reset_quota`](crate::Upstream::reset_quota).
    QuotaExhausted,
    /// The request names a priority class the upstream does not have
    /// ([`class`](crate::Error::class)); refused before any wait.
    UnknownClass,
    /// The scheduler's actors are gone (the actix system is shutting down).
    Stopped,
    /// An operation that needs the shared store (an operator's clear of a provider window)
    /// could not reach it; nothing was changed for the fleet. Try again once it is back.
    StoreUnavailable,
    /// A live change (e.g. [`Upstream::set_limit`](crate::Upstream::set_limit)) with a value
    /// the setting cannot take (a limit of 0, an override of no time); nothing was changed.
    InvalidSetting,
}

impl ErrorKind {
    /// A stable snake_case code, for metrics and machine-readable bodies.
    pub const fn code(self) -> &'static str {
        match self {
            ErrorKind::UnknownUpstream => "unknown_upstream",
            ErrorKind::QueueFull => "queue_full",
            ErrorKind::WaitedTooLong => "waited_too_long",
            ErrorKind::BreakerOpen => "breaker_open",
            ErrorKind::RetryBudgetSpent => "retry_budget_spent",
            ErrorKind::DeadlinePassed => "deadline_passed",
            ErrorKind::Upstream => "upstream_error",
            ErrorKind::InsufficientCapacity => "insufficient_capacity",
            ErrorKind::QuotaExhausted => "quota_exhausted",
            ErrorKind::UnknownClass => "unknown_class",
            ErrorKind::Stopped => "stopped",
            ErrorKind::StoreUnavailable => "store_unavailable",
            ErrorKind::InvalidSetting => "invalid_setting",
        }
    }

    /// Whether this kind is an overload refusal: waited too long, queue full, breaker open,
    /// retry budget spent.
    pub const fn is_overload(self) -> bool {
        matches!(
            self,
            ErrorKind::QueueFull | ErrorKind::WaitedTooLong | ErrorKind::BreakerOpen | ErrorKind::RetryBudgetSpent
        )
    }
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.code())
    }
}

/// The tokens budget an estimate can never fit ([`ErrorKind::InsufficientCapacity`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Budget {
    /// The upstream's tokens-per-minute budget: the estimate never fits, in any mode.
    TokensPerMinute,
    /// This process's share of the tokens-per-minute budget while the shared store is
    /// unreachable (fallback): the estimate fits again once the store is back. No longer
    /// returned: in fallback an estimate above the share's burst is admitted against the
    /// share's rate, in debt, and only one above the fleet's burst is refused
    /// ([`Budget::TokensPerMinute`]). Kept so that code matching on it still compiles.
    FallbackShare,
    /// The request's priority class's share of the tokens-per-minute budget (a class with a
    /// budget share).
    ClassShare,
    /// The upstream's input-tokens-per-minute budget: the estimate's input part (less its
    /// output, [`RequestBuilder::output_tokens`](crate::RequestBuilder::output_tokens)) never
    /// fits.
    InputTokensPerMinute,
    /// The upstream's output-tokens-per-minute budget: the estimate's output part never fits.
    OutputTokensPerMinute,
    /// The upstream's tokens-per-day budget: the estimate is above its burst.
    TokensPerDay,
}

impl Budget {
    /// `tokens_per_minute`, `tokens_per_minute_fallback_share`,
    /// `tokens_per_minute_class_share`, `input_tokens_per_minute`, `output_tokens_per_minute` or `tokens_per_day`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Budget::TokensPerMinute => "tokens_per_minute",
            Budget::FallbackShare => "tokens_per_minute_fallback_share",
            Budget::ClassShare => "tokens_per_minute_class_share",
            Budget::InputTokensPerMinute => "input_tokens_per_minute",
            Budget::OutputTokensPerMinute => "output_tokens_per_minute",
            Budget::TokensPerDay => "tokens_per_day",
        }
    }
}

impl fmt::Display for Budget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
