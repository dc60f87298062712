//! What an upstream call's result means for the scheduler.
//!
//! One classification decides which layer owns the result:
//!
//! | outcome | wave (shared cooldown) | circuit breaker | retried |
//! |---|---|---|---|
//! | 2xx | success | success | — |
//! | 429 | cut + cooldown | never counted | through a new permit |
//! | 502, 503, 504, connect, reset, timeout | — | failure | with backoff, inside the retry budget |
//! | other 5xx | — | failure | no |
//! | other 4xx | — | ignored | never |
//! | 1xx, 3xx, out of range | — | ignored | never |

use std::time::{Duration, SystemTime};

use crate::breaker::CallResult;
use crate::gate::WaveSignal;
use crate::retry_after::parse_retry_after;

/// A failure below HTTP: the request never got a status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum TransportError {
    /// The connection could not be made (refused, DNS, TLS handshake).
    Connect,
    /// The connection was reset or closed before a full response.
    Reset,
    /// The call did not finish within its timeout.
    Timeout,
}

/// The kind of a transient failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Transient {
    /// 502, 503 or 504.
    Status(u16),
    /// A transport failure.
    Transport(TransportError),
}

/// The meaning of one call's result.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Outcome {
    /// 2xx.
    Success {
        /// The status code.
        status: u16,
    },
    /// 429: the shared scheduler cools down and the call is retried through a new permit.
    RateLimited {
        /// The provider's `Retry-After`, when it sent a usable one.
        retry_after: Option<Duration>,
    },
    /// Worth a retry with backoff: 502, 503, 504 and transport failures.
    Transient {
        /// Which one.
        kind: Transient,
        /// A `Retry-After` sent with a 503, when usable.
        retry_after: Option<Duration>,
    },
    /// Any other 5xx: a breaker failure, not retried.
    ServerError {
        /// The status code.
        status: u16,
    },
    /// 4xx other than 429: the request is wrong, never retried.
    ClientError {
        /// The status code.
        status: u16,
    },
    /// 1xx, 3xx or a code outside 100–599: not retried, not a breaker failure.
    Unexpected {
        /// The status code.
        status: u16,
    },
}

impl Outcome {
    /// Classifies an HTTP status with the response's `Retry-After` value, if any.
    /// A malformed `Retry-After` is ignored (the cooldown ladder applies instead).
    ///
    /// ```
    /// use std::time::{Duration, SystemTime};
    /// use wavegate_core::Outcome;
    ///
    /// let now = SystemTime::now();
    /// assert_eq!(
    ///     Outcome::from_status(429, Some("3"), now),
    ///     Outcome::RateLimited { retry_after: Some(Duration::from_secs(3)) }
    /// );
    /// assert_eq!(Outcome::from_status(429, Some("later"), now), Outcome::RateLimited { retry_after: None });
    /// assert!(Outcome::from_status(503, None, now).is_retryable());
    /// assert!(!Outcome::from_status(400, None, now).is_retryable());
    /// ```
    pub fn from_status(status: u16, retry_after: Option<&str>, now: SystemTime) -> Self {
        let retry_after = || retry_after.and_then(|value| parse_retry_after(value, now).ok());
        match status {
            200..=299 => Outcome::Success { status },
            429 => Outcome::RateLimited { retry_after: retry_after() },
            502..=504 => Outcome::Transient { kind: Transient::Status(status), retry_after: retry_after() },
            500..=599 => Outcome::ServerError { status },
            400..=499 => Outcome::ClientError { status },
            _ => Outcome::Unexpected { status },
        }
    }

    /// Classifies an HTTP response by its status and its `Retry-After` header (feature
    /// `http`), as [`from_status`](Self::from_status) does, at the current time.
    ///
    /// ```
    /// use std::time::Duration;
    /// use wavegate_core::Outcome;
    ///
    /// let response = http::Response::builder().status(429).header("retry-after", "2").body(()).unwrap();
    /// assert_eq!(Outcome::from_response(&response), Outcome::RateLimited { retry_after: Some(Duration::from_secs(2)) });
    /// ```
    #[cfg(feature = "http")]
    pub fn from_response<B>(response: &http::Response<B>) -> Self {
        Self::from_head(response.status(), response.headers())
    }

    /// Classifies a response head — its status and headers, e.g. a `reqwest::Response`'s
    /// `status()` and `headers()` — reading `Retry-After` (feature `http`).
    #[cfg(feature = "http")]
    pub fn from_head(status: http::StatusCode, headers: &http::HeaderMap) -> Self {
        let retry_after = headers.get(http::header::RETRY_AFTER).and_then(|value| value.to_str().ok());
        Self::from_status(status.as_u16(), retry_after, SystemTime::now())
    }

    /// Classifies a call that got no status.
    pub fn from_transport(error: TransportError) -> Self {
        Outcome::Transient { kind: Transient::Transport(error), retry_after: None }
    }

    /// Whether the scheduler retries this outcome (a 429 through the shared cooldown, a
    /// transient failure with backoff inside the retry budget).
    pub fn is_retryable(&self) -> bool {
        matches!(self, Outcome::RateLimited { .. } | Outcome::Transient { .. })
    }

    /// What the wave machine learns from it.
    pub fn wave_signal(&self) -> WaveSignal {
        match self {
            Outcome::Success { .. } => WaveSignal::Success,
            Outcome::RateLimited { retry_after } => WaveSignal::RateLimited { retry_after: *retry_after },
            _ => WaveSignal::Neutral,
        }
    }

    /// What the circuit breaker learns from it: a 429 is never a breaker failure.
    pub fn breaker_result(&self) -> CallResult {
        match self {
            Outcome::Success { .. } => CallResult::Success,
            Outcome::Transient { .. } | Outcome::ServerError { .. } => CallResult::Failure,
            Outcome::RateLimited { .. } | Outcome::ClientError { .. } | Outcome::Unexpected { .. } => {
                CallResult::Ignored
            }
        }
    }

    /// The HTTP status, when the call got one (`None` for transport failures).
    pub const fn status(&self) -> Option<u16> {
        match self {
            Outcome::Success { status }
            | Outcome::ServerError { status }
            | Outcome::ClientError { status }
            | Outcome::Unexpected { status }
            | Outcome::Transient { kind: Transient::Status(status), .. } => Some(*status),
            Outcome::RateLimited { .. } => Some(429),
            Outcome::Transient { kind: Transient::Transport(_), .. } => None,
        }
    }

    /// A stable lower-case label for metrics and logs.
    pub const fn label(&self) -> &'static str {
        match self {
            Outcome::Success { .. } => "success",
            Outcome::RateLimited { .. } => "rate_limited",
            Outcome::Transient { .. } => "transient",
            Outcome::ServerError { .. } => "server_error",
            Outcome::ClientError { .. } => "client_error",
            Outcome::Unexpected { .. } => "unexpected",
        }
    }
}

/// `rate_limited (429)`, `transient (connection reset)`, ...: the label and what it came from.
impl std::fmt::Display for Outcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Outcome::Transient { kind: Transient::Transport(error), .. } => {
                let what = match error {
                    TransportError::Connect => "connect error",
                    TransportError::Reset => "connection reset",
                    TransportError::Timeout => "timeout",
                };
                write!(f, "{} ({what})", self.label())
            }
            _ => match self.status() {
                Some(status) => write!(f, "{} ({status})", self.label()),
                None => f.write_str(self.label()),
            },
        }
    }
}

/// An outcome is also an error value: a closure may fail with `Err(outcome)`.
impl std::error::Error for Outcome {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_status_has_one_owner() {
        let now = SystemTime::now();
        for status in 0..=1000u16 {
            let outcome = Outcome::from_status(status, Some("1"), now);
            let wave = outcome.wave_signal();
            let breaker = outcome.breaker_result();
            if status == 429 {
                assert!(matches!(wave, WaveSignal::RateLimited { .. }));
                assert_eq!(breaker, CallResult::Ignored, "a 429 is never a breaker failure");
            } else {
                assert!(!matches!(wave, WaveSignal::RateLimited { .. }), "{status}");
            }
            if (400..500).contains(&status) && status != 429 {
                assert!(!outcome.is_retryable(), "{status} must never be retried");
            }
            if matches!(status, 502..=504) {
                assert!(outcome.is_retryable());
                assert_eq!(breaker, CallResult::Failure);
            }
        }
    }

    #[test]
    fn transport_failures_are_transient_breaker_failures() {
        for error in [TransportError::Connect, TransportError::Reset, TransportError::Timeout] {
            let outcome = Outcome::from_transport(error);
            assert!(outcome.is_retryable());
            assert_eq!(outcome.breaker_result(), CallResult::Failure);
            assert_eq!(outcome.wave_signal(), WaveSignal::Neutral);
        }
    }
}
