//! The one error type callers see: one struct with a kind, the upstream it is about once, and
//! what the kind knows behind accessors (like reqwest's `Error`).

use std::convert::Infallible;
use std::fmt;

pub use crate::error_kind::{Budget, ErrorKind};
use std::time::Duration;

use wavegate_core::{LiveError, Outcome, Transient, TransportError, UnknownUpstream};

/// The hint [`Error::retry_after`] gives when nothing more precise is known.
const DEFAULT_RETRY_AFTER: Duration = Duration::from_secs(1);

/// Why a call or an acquire did not succeed.
///
/// What went wrong is its [`kind`](Error::kind); the upstream (or pool) it is about is
/// [`upstream`](Error::upstream); what the kind knows comes through accessors
/// ([`attempts`](Error::attempts), [`retry_after`](Error::retry_after),
/// [`outcome`](Error::outcome), ...) that answer `None` for the kinds that do not know it.
///
/// The overload errors ([`is_overload`](Error::is_overload): waited too long, queue full,
/// breaker open, retry budget spent) mean "the provider is saturated, try later" and carry a
/// [`retry_after`](Error::retry_after) hint for end users (HTTP 503 + `Retry-After`).
///
/// `E` is the caller's own error type: a call whose closure fails with `Err(e)` that is not
/// retried (or has no retry left) ends with an [`ErrorKind::Upstream`] error holding `e`,
/// untouched ([`source_error`](Error::source_error), [`into_source`](Error::into_source)).
/// Everything that has no caller's error (acquire, status) uses the default,
/// `Error<Infallible>`, which is what plain `Error` means;
/// [`without_source`](Error::without_source) turns any `Error<E>` into it.
///
/// It is one pointer wide, so a `Result<T, Error<E>>` stays cheap to move.
///
/// ```
/// use std::time::Duration;
/// use wavegate::{ErrorKind, Scheduler, UpstreamConfig};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let scheduler = Scheduler::builder()
///     .upstream(UpstreamConfig::builder("images").limit(1).max_wait(Duration::from_millis(20)).build()?)
///     .build()?;
/// let images = scheduler.upstream("images")?;
/// let _held = images.request().acquire().await?;
/// let error = images.request().acquire().await.unwrap_err();
/// assert_eq!(error.kind(), ErrorKind::WaitedTooLong);
/// assert_eq!(error.upstream(), Some("images"));
/// assert!(error.is_overload());
/// assert_eq!(error.code(), "waited_too_long");
/// assert!(error.retry_after().is_some());
/// # Ok(()) }
/// ```
pub struct Error<E = Infallible> {
    inner: Box<Inner<E>>,
}

#[derive(Clone)]
struct Inner<E> {
    kind: ErrorKind,
    /// The upstream (or pool) the error is about; `None` only when the scheduler stopped.
    upstream: Option<String>,
    /// Attempts made, for the kinds that count them.
    attempts: Option<u32>,
    detail: Detail,
    /// The caller's own error ([`ErrorKind::Upstream`] only).
    source: Option<E>,
}

/// What a kind knows beyond the upstream and the attempts.
#[derive(Debug, Clone)]
enum Detail {
    None,
    UnknownUpstream(UnknownUpstream),
    QueueFull {
        capacity: usize,
    },
    WaitedTooLong {
        waited: Duration,
        retry_after: Option<Duration>,
        /// Refused before the wait bound: a permit was proved unable to come by then.
        early: bool,
    },
    BreakerOpen {
        retry_after: Duration,
    },
    RetryBudgetSpent {
        last: &'static str,
    },
    Upstream {
        /// Boxed: an outcome carries every signal its response sent.
        outcome: Box<Outcome>,
    },
    InsufficientCapacity {
        budget: Budget,
        requested: u64,
        burst: u64,
    },
    QuotaExhausted {
        retry_after: Duration,
    },
    UnknownClass {
        class: String,
        known: Vec<String>,
    },
    Store {
        operation: &'static str,
        message: String,
    },
    /// A live change refused before anything was stored.
    InvalidSetting(LiveError),
    /// A deadline that passed while a known wait (a cooldown, a provider window) held the
    /// permits back: when it ends.
    DeadlineHint {
        retry_after: Duration,
        early: bool,
    },
}

/// The constructors, one per kind (crate-private: callers only receive errors).
impl<E> Error<E> {
    fn new(kind: ErrorKind, upstream: Option<String>, attempts: Option<u32>, detail: Detail) -> Self {
        Self { inner: Box::new(Inner { kind, upstream, attempts, detail, source: None }) }
    }

    /// [`ErrorKind::QueueFull`].
    pub(crate) fn queue_full(upstream: impl Into<String>, capacity: usize) -> Self {
        Self::new(ErrorKind::QueueFull, Some(upstream.into()), None, Detail::QueueFull { capacity })
    }

    /// [`ErrorKind::WaitedTooLong`]: waited `waited`; a permit may come after `retry_after`
    /// (the rest of a cooldown), if known.
    pub(crate) fn waited_too_long(
        upstream: impl Into<String>,
        waited: Duration,
        retry_after: Option<Duration>,
    ) -> Self {
        let detail = Detail::WaitedTooLong { waited, retry_after, early: false };
        Self::new(ErrorKind::WaitedTooLong, Some(upstream.into()), None, detail)
    }

    /// [`ErrorKind::WaitedTooLong`] before the wait bound, after `waited`: what the lane knows
    /// proves no permit can come for `needed` (see [`needed`](Self::needed)).
    pub(crate) fn refused_early(upstream: impl Into<String>, waited: Duration, needed: Duration) -> Self {
        let detail = Detail::WaitedTooLong { waited, retry_after: Some(needed), early: true };
        Self::new(ErrorKind::WaitedTooLong, Some(upstream.into()), None, detail)
    }

    /// [`ErrorKind::BreakerOpen`]: a probe goes through after `retry_after`.
    pub(crate) fn breaker_open(upstream: impl Into<String>, retry_after: Duration) -> Self {
        Self::new(ErrorKind::BreakerOpen, Some(upstream.into()), None, Detail::BreakerOpen { retry_after })
    }

    /// [`ErrorKind::RetryBudgetSpent`] after `attempts`, the last one's outcome labelled `last`.
    pub(crate) fn retry_budget_spent(upstream: impl Into<String>, attempts: u32, last: &'static str) -> Self {
        let detail = Detail::RetryBudgetSpent { last };
        Self::new(ErrorKind::RetryBudgetSpent, Some(upstream.into()), Some(attempts), detail)
    }

    /// [`ErrorKind::DeadlinePassed`] after `attempts`.
    pub(crate) fn deadline_passed(upstream: impl Into<String>, attempts: u32) -> Self {
        Self::new(ErrorKind::DeadlinePassed, Some(upstream.into()), Some(attempts), Detail::None)
    }

    /// [`ErrorKind::DeadlinePassed`] after `attempts`, for a permit that `waited` (a
    /// [`ErrorKind::WaitedTooLong`] bounded by the deadline) says could not come in time: the
    /// hint of when one may come is kept.
    pub(crate) fn deadline_passed_waiting<F>(upstream: impl Into<String>, waited: &Error<F>, attempts: u32) -> Self {
        let detail = match waited.inner.detail {
            Detail::WaitedTooLong { retry_after: Some(retry_after), early, .. } => {
                Detail::DeadlineHint { retry_after, early }
            }
            _ => Detail::None,
        };
        Self::new(ErrorKind::DeadlinePassed, Some(upstream.into()), Some(attempts), detail)
    }

    /// [`ErrorKind::Upstream`]: the last attempt's `outcome`, with the caller's own error if it
    /// ended with one (`None` when it timed out).
    pub(crate) fn upstream_failed(
        upstream: impl Into<String>,
        outcome: Outcome,
        attempts: u32,
        source: Option<E>,
    ) -> Self {
        let mut error = Self::new(
            ErrorKind::Upstream,
            Some(upstream.into()),
            Some(attempts),
            Detail::Upstream { outcome: Box::new(outcome) },
        );
        error.inner.source = source;
        error
    }

    /// [`ErrorKind::InsufficientCapacity`]: `requested` tokens, more than `budget`'s `burst`.
    pub(crate) fn insufficient_capacity(
        upstream: impl Into<String>,
        budget: Budget,
        requested: u64,
        burst: u64,
    ) -> Self {
        let detail = Detail::InsufficientCapacity { budget, requested, burst };
        Self::new(ErrorKind::InsufficientCapacity, Some(upstream.into()), None, detail)
    }

    /// [`ErrorKind::QuotaExhausted`] after `attempts` (1 for the call that met the refusal, 0
    /// for those refused after it); refused for `retry_after` more.
    pub(crate) fn quota_exhausted(upstream: impl Into<String>, attempts: u32, retry_after: Duration) -> Self {
        let detail = Detail::QuotaExhausted { retry_after };
        Self::new(ErrorKind::QuotaExhausted, Some(upstream.into()), Some(attempts), detail)
    }

    /// [`ErrorKind::UnknownClass`]: `class` asked for, the upstream's classes `known`.
    pub(crate) fn unknown_class(upstream: impl Into<String>, class: impl Into<String>, known: Vec<String>) -> Self {
        let detail = Detail::UnknownClass { class: class.into(), known };
        Self::new(ErrorKind::UnknownClass, Some(upstream.into()), None, detail)
    }

    /// [`ErrorKind::StoreUnavailable`]: `operation` needed the shared store, which answered
    /// `message`.
    pub(crate) fn store_unavailable(upstream: impl Into<String>, operation: &'static str, message: String) -> Self {
        let detail = Detail::Store { operation, message };
        Self::new(ErrorKind::StoreUnavailable, Some(upstream.into()), None, detail)
    }

    /// [`ErrorKind::InvalidSetting`]: a live change of `upstream` that cannot be used.
    pub(crate) fn invalid_setting(upstream: impl Into<String>, error: LiveError) -> Self {
        Self::new(ErrorKind::InvalidSetting, Some(upstream.into()), None, Detail::InvalidSetting(error))
    }

    /// [`ErrorKind::Stopped`].
    pub(crate) fn stopped() -> Self {
        Self::new(ErrorKind::Stopped, None, None, Detail::None)
    }

    /// The same error counting `attempts` (for the kinds that count them).
    pub(crate) fn with_attempts(mut self, attempts: u32) -> Self {
        if self.inner.attempts.is_some() {
            self.inner.attempts = Some(attempts);
        }
        self
    }

    /// The caller's own error if there is one, else this error without it.
    #[cfg_attr(not(feature = "reqwest-middleware"), allow(dead_code))]
    pub(crate) fn split_source(mut self) -> Result<E, Error> {
        match self.inner.source.take() {
            Some(source) => Ok(source),
            None => Err(self.without_source()),
        }
    }
}

impl Error {
    /// An error that holds no caller's error, as an `Error<E>` of any `E`.
    pub(crate) fn widen<E>(self) -> Error<E> {
        self.map_source(|never| match never {})
    }
}

impl<E> From<UnknownUpstream> for Error<E> {
    fn from(unknown: UnknownUpstream) -> Self {
        let upstream = Some(unknown.name.clone());
        Self::new(ErrorKind::UnknownUpstream, upstream, None, Detail::UnknownUpstream(unknown))
    }
}

/// What an error says.
impl<E> Error<E> {
    /// What kind of error this is.
    pub fn kind(&self) -> ErrorKind {
        self.inner.kind
    }

    /// A stable snake_case code, for metrics and machine-readable bodies: the kind's
    /// [`code`](ErrorKind::code).
    pub fn code(&self) -> &'static str {
        self.inner.kind.code()
    }

    /// The upstream (or, from a [`Pool`](crate::Pool), the pool or its member) the error is
    /// about; the unknown name for [`ErrorKind::UnknownUpstream`]; `None` only for
    /// [`ErrorKind::Stopped`].
    pub fn upstream(&self) -> Option<&str> {
        self.inner.upstream.as_deref()
    }

    /// Attempts made by the call, for the kinds that count them: retry budget spent, deadline
    /// passed, upstream failure, quota exhausted (0 when refused before any attempt).
    pub fn attempts(&self) -> Option<u32> {
        self.inner.attempts
    }

    /// A hint for when trying again may work: for the overload errors, a passed deadline and
    /// a spent quota (the rest of a cooldown, of an open breaker or of the quota's refusal
    /// when known, else 1 s).
    pub fn retry_after(&self) -> Option<Duration> {
        match (&self.inner.detail, self.inner.kind) {
            (Detail::WaitedTooLong { retry_after, .. }, _) => Some(retry_after.unwrap_or(DEFAULT_RETRY_AFTER)),
            (Detail::DeadlineHint { retry_after, .. }, _) => Some(*retry_after),
            (Detail::BreakerOpen { retry_after } | Detail::QuotaExhausted { retry_after }, _) => Some(*retry_after),
            (_, ErrorKind::QueueFull | ErrorKind::RetryBudgetSpent | ErrorKind::DeadlinePassed) => {
                Some(DEFAULT_RETRY_AFTER)
            }
            _ => None,
        }
    }

    /// Refused before its wait bound (its deadline or the upstream's `max_wait`) because what
    /// the scheduler knows proves that no permit can come by then — a cooldown, a spent
    /// provider window, a rate budget without room (`docs/guarantees.md`, "Deadlines"): how
    /// long from the refusal until one could come at the earliest (also
    /// [`retry_after`](Self::retry_after)). `None` for any other error, and for a caller that
    /// waited until its bound.
    pub fn needed(&self) -> Option<Duration> {
        match self.inner.detail {
            Detail::WaitedTooLong { retry_after, early: true, .. } => retry_after,
            Detail::DeadlineHint { retry_after, early: true } => Some(retry_after),
            _ => None,
        }
    }

    /// How long the caller waited for a permit ([`ErrorKind::WaitedTooLong`]).
    pub fn waited(&self) -> Option<Duration> {
        match self.inner.detail {
            Detail::WaitedTooLong { waited, .. } => Some(waited),
            _ => None,
        }
    }

    /// The last attempt's outcome ([`ErrorKind::Upstream`]); [`Outcome::status`] gives its HTTP
    /// status.
    pub fn outcome(&self) -> Option<&Outcome> {
        match &self.inner.detail {
            Detail::Upstream { outcome } => Some(outcome),
            _ => None,
        }
    }

    /// The HTTP status of an upstream failure.
    pub fn upstream_status(&self) -> Option<u16> {
        self.outcome().and_then(Outcome::status)
    }

    /// The queue's capacity ([`ErrorKind::QueueFull`]).
    pub fn queue_capacity(&self) -> Option<usize> {
        match self.inner.detail {
            Detail::QueueFull { capacity } => Some(capacity),
            _ => None,
        }
    }

    /// The budget an estimate can never fit ([`ErrorKind::InsufficientCapacity`]).
    pub fn budget(&self) -> Option<Budget> {
        match self.inner.detail {
            Detail::InsufficientCapacity { budget, .. } => Some(budget),
            _ => None,
        }
    }

    /// The tokens asked for ([`ErrorKind::InsufficientCapacity`]).
    pub fn requested(&self) -> Option<u64> {
        match self.inner.detail {
            Detail::InsufficientCapacity { requested, .. } => Some(requested),
            _ => None,
        }
    }

    /// The [`budget`](Self::budget)'s burst, which the request exceeds
    /// ([`ErrorKind::InsufficientCapacity`]).
    pub fn burst(&self) -> Option<u64> {
        match self.inner.detail {
            Detail::InsufficientCapacity { burst, .. } => Some(burst),
            _ => None,
        }
    }

    /// The priority class asked for ([`ErrorKind::UnknownClass`]).
    pub fn class(&self) -> Option<&str> {
        match &self.inner.detail {
            Detail::UnknownClass { class, .. } => Some(class),
            _ => None,
        }
    }

    /// The upstream's priority classes, in configuration order; empty when it has none
    /// ([`ErrorKind::UnknownClass`]).
    pub fn known_classes(&self) -> Option<&[String]> {
        match &self.inner.detail {
            Detail::UnknownClass { known, .. } => Some(known),
            _ => None,
        }
    }

    /// Whether this is an overload refusal: waited too long, queue full, breaker open, retry
    /// budget spent ([`ErrorKind::is_overload`]).
    pub fn is_overload(&self) -> bool {
        self.inner.kind.is_overload()
    }

    /// Whether a time limit of the call ended it: its deadline (or the upstream's total
    /// timeout) passed, or its last attempt ran past the call timeout. Not a wait for a
    /// permit that gave up ([`ErrorKind::WaitedTooLong`], an overload).
    pub fn is_timeout(&self) -> bool {
        self.inner.kind == ErrorKind::DeadlinePassed || self.is_call_timeout()
    }

    /// Whether the same request may succeed later: the overload refusals, a passed deadline,
    /// a spent quota (after [`retry_after`](Self::retry_after)), a failure the upstream
    /// called transient or a rate limit (wavegate's own retries ran out), an estimate that only
    /// exceeds this process's fallback share. Not an unknown name or class, an estimate that
    /// never fits, a failure the provider will repeat (a 4xx, a 501) or a stopped scheduler.
    pub fn is_retryable(&self) -> bool {
        match (&self.inner.detail, self.inner.kind) {
            (Detail::Upstream { outcome }, _) => outcome.is_retryable(),
            (Detail::InsufficientCapacity { budget, .. }, _) => *budget == Budget::FallbackShare,
            (_, kind) => kind.is_overload() || matches!(kind, ErrorKind::DeadlinePassed | ErrorKind::QuotaExhausted),
        }
    }

    /// The last attempt ran past the call timeout.
    fn is_call_timeout(&self) -> bool {
        matches!(
            &self.inner.detail,
            Detail::Upstream { outcome }
                if matches!(**outcome, Outcome::Transient { kind: Transient::Transport(TransportError::Timeout), .. })
        )
    }
}

/// The caller's own error.
impl<E> Error<E> {
    /// The caller's own error, if the call ended with one ([`ErrorKind::Upstream`]).
    pub fn source_error(&self) -> Option<&E> {
        self.inner.source.as_ref()
    }

    /// Takes the caller's own error out, if the call ended with one.
    pub fn into_source(self) -> Option<E> {
        self.inner.source
    }

    /// The same error with the caller's error turned by `f`.
    pub fn map_source<F>(self, f: impl FnOnce(E) -> F) -> Error<F> {
        let Inner { kind, upstream, attempts, detail, source } = *self.inner;
        Error { inner: Box::new(Inner { kind, upstream, attempts, detail, source: source.map(f) }) }
    }

    /// The same error without the caller's error (its [`outcome`](Self::outcome) stays): a
    /// plain [`Error`], e.g. to render it as a response.
    pub fn without_source(self) -> Error {
        let Inner { kind, upstream, attempts, detail, source: _ } = *self.inner;
        Error { inner: Box::new(Inner { kind, upstream, attempts, detail, source: None }) }
    }
}

impl<E: Clone> Clone for Error<E> {
    fn clone(&self) -> Self {
        Self { inner: self.inner.clone() }
    }
}

/// `n attempt` or `n attempts`.
struct Attempts(u32);

impl fmt::Display for Attempts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            1 => f.write_str("1 attempt"),
            n => write!(f, "{n} attempts"),
        }
    }
}

impl<E> fmt::Display for Error<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let upstream = self.inner.upstream.as_deref().unwrap_or_default();
        let attempts = Attempts(self.inner.attempts.unwrap_or_default());
        match (&self.inner.detail, self.inner.kind) {
            (Detail::UnknownUpstream(unknown), _) => unknown.fmt(f),
            (Detail::QueueFull { capacity }, _) => {
                write!(f, "upstream `{upstream}`: {capacity} callers are already waiting for a permit")
            }
            (Detail::WaitedTooLong { retry_after: Some(needed), early: true, .. }, _) => {
                write!(f, "upstream `{upstream}`: no permit can come within the wait; one may in {needed:?}")
            }
            (Detail::WaitedTooLong { waited, .. }, _) => {
                write!(f, "upstream `{upstream}`: no permit within {waited:?}")
            }
            (Detail::BreakerOpen { .. }, _) => write!(f, "upstream `{upstream}`: circuit breaker open"),
            (Detail::RetryBudgetSpent { last }, _) => {
                write!(f, "upstream `{upstream}`: retry budget spent after {attempts} (last: {last})")
            }
            (Detail::DeadlineHint { retry_after, .. }, _) => write!(
                f,
                "upstream `{upstream}` timed out: no permit could come before the request's deadline \
                 (after {attempts}; one may come in {retry_after:?})"
            ),
            (_, ErrorKind::DeadlinePassed) => {
                write!(f, "upstream `{upstream}` timed out: the request's deadline passed after {attempts}")
            }
            (Detail::Upstream { .. }, _) if self.is_call_timeout() => write!(
                f,
                "upstream `{upstream}` timed out: no answer within the call timeout (after {attempts}, the last timed out)"
            ),
            (Detail::Upstream { outcome }, _) => write!(f, "upstream `{upstream}` failed ({outcome}) after {attempts}"),
            (Detail::InsufficientCapacity { budget: Budget::FallbackShare, requested, burst }, _) => write!(
                f,
                "upstream `{upstream}`: {requested} tokens do not fit this process's share of the tokens \
                 burst ({burst}) while the shared store is unreachable; they fit once it is back"
            ),
            (Detail::InsufficientCapacity { budget: Budget::ClassShare, requested, burst }, _) => write!(
                f,
                "upstream `{upstream}`: {requested} tokens can never fit the class's share of the tokens_per_minute \
                 burst ({burst})"
            ),
            (Detail::InsufficientCapacity { budget, requested, burst }, _) => {
                write!(f, "upstream `{upstream}`: {requested} tokens can never fit a {budget} burst of {burst}")
            }
            (Detail::QuotaExhausted { retry_after }, _) => write!(
                f,
                "upstream `{upstream}`: the provider's quota is exhausted (after {attempts}); refused for \
                 {retry_after:?} or until an operator resets it"
            ),
            (Detail::UnknownClass { class, known }, _) if known.is_empty() => write!(
                f,
                "upstream `{upstream}` has no priority classes, so class `{class}` is unknown; add it with \
                 `UpstreamConfig::builder(..).class(name, weight)` or drop `.priority(..)`"
            ),
            (Detail::UnknownClass { class, known }, _) => {
                write!(f, "upstream `{upstream}` has no priority class `{class}`; its classes: {}", known.join(", "))
            }
            (Detail::Store { operation, message }, _) => write!(
                f,
                "upstream `{upstream}`: {operation} needs the shared store, which did not answer ({message}); \
                 nothing changed for the fleet, try again once it is back"
            ),
            (Detail::InvalidSetting(error), _) => {
                write!(f, "upstream `{upstream}`: the live change was refused: {error}")
            }
            (Detail::None, _) => f.write_str("the scheduler has stopped"),
        }
    }
}

impl<E: std::error::Error + 'static> std::error::Error for Error<E> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match (&self.inner.detail, &self.inner.source) {
            (Detail::UnknownUpstream(unknown), _) => Some(unknown),
            (_, Some(source)) => Some(source),
            _ => None,
        }
    }
}

mod debug;
#[cfg(test)]
mod tests;
