//! wavegate's errors as HTTP responses (the table is on [`WebError`]).

use std::fmt;

use serde::Serialize;
use wavegate::Error;
use wavegate::core::{Outcome, Transient, TransportError};

/// A [`wavegate::Error`] that actix-web (feature `actix-web`) and axum (feature `axum`) render
/// as a response.
/// Handlers return `Result<_, WebError>` and use `?` on scheduler calls.
///
/// | error | status | `Retry-After` |
/// |---|---|---|
/// | waited too long, queue full, breaker open, retry budget spent (overload) | 503 | yes |
/// | deadline passed | 504 | yes |
/// | the upstream call timed out (the call timeout, or the client's own) | 504 | no |
/// | the provider's quota is exhausted | 503 | yes (until the refusal ends) |
/// | other upstream failures (4xx, 5xx — a provider's own 504 too —, connect, reset) | 502 | no |
/// | unknown upstream (a bug in the app), scheduler stopped | 500, 503 | no |
///
/// The body is a small JSON object with a stable machine-readable `code`, a human `message`
/// and, when known, `retry_after_seconds` and the `upstream_status`:
///
/// ```json
/// {"code":"waited_too_long","message":"upstream `llm`: no permit within 25s","retry_after_seconds":3}
/// {"code":"upstream_timeout","message":"upstream `llm` timed out: no answer in time (after 4 attempts)"}
/// ```
///
/// The caller's own error inside an [`Error::Upstream`] (an `Error<E>`) is not part of the
/// response (it may hold internal details): `?` keeps its outcome and drops it. Handle it
/// before `?` if the end user should see it.
#[derive(Debug)]
pub struct WebError(pub Error);

impl<E> From<Error<E>> for WebError {
    fn from(error: Error<E>) -> Self {
        Self(error.without_source())
    }
}

impl fmt::Display for WebError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for WebError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.0)
    }
}

/// The JSON body of an error response.
#[derive(Debug, Serialize)]
pub struct ErrorBody {
    /// A stable snake_case code, e.g. `waited_too_long`.
    pub code: &'static str,
    /// What happened, for people.
    pub message: String,
    /// When trying again may work, in whole seconds (also in the `Retry-After` header).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retry_after_seconds: Option<u64>,
    /// The upstream's own status, for upstream failures.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub upstream_status: Option<u16>,
}

impl WebError {
    /// The `Retry-After` to send, in whole seconds (at least 1), for overloads and deadlines.
    pub fn retry_after_seconds(&self) -> Option<u64> {
        match &self.0 {
            error
                if error.is_overload()
                    || matches!(error, Error::DeadlinePassed { .. } | Error::QuotaExhausted { .. }) =>
            {
                error.retry_after().map(|after| after.as_secs() + u64::from(after.subsec_nanos() > 0)).map(|s| s.max(1))
            }
            _ => None,
        }
    }

    /// The HTTP status of the response (the table above), for any framework.
    pub fn status(&self) -> u16 {
        match &self.0 {
            error if error.is_overload() => 503,
            error if upstream_timed_out(error).is_some() => 504,
            Error::DeadlinePassed { .. } => 504,
            Error::Upstream { .. } => 502,
            Error::Stopped | Error::QuotaExhausted { .. } => 503,
            _ => 500,
        }
    }

    /// The JSON body.
    pub fn body(&self) -> ErrorBody {
        let (code, message) = match upstream_timed_out(&self.0) {
            Some((upstream, attempts)) => (
                "upstream_timeout",
                format!("upstream `{upstream}` timed out: no answer in time (after {attempts} attempts)"),
            ),
            None => (self.0.code(), self.0.to_string()),
        };
        ErrorBody {
            code,
            message,
            retry_after_seconds: self.retry_after_seconds(),
            upstream_status: self.0.upstream_status(),
        }
    }
}

/// The upstream and the attempts made, when `error` is an upstream call that timed out: the
/// last attempt was cut by the call timeout, or the caller's client said it timed out (both
/// are the outcome `TransportError::Timeout`). Not a deadline that passed (its own 504,
/// `deadline_passed`), nor a provider's 504 (an answer: 502 with `upstream_status` 504).
///
/// The one place that knows how `wavegate::Error` says "timed out" (with the error as a
/// struct with a kind: `is_timeout()` on an upstream failure).
fn upstream_timed_out(error: &Error) -> Option<(&str, u32)> {
    match error {
        Error::Upstream {
            upstream,
            attempts,
            outcome: Outcome::Transient { kind: Transient::Transport(TransportError::Timeout), .. },
            ..
        } => Some((upstream, *attempts)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, SystemTime};

    use super::*;

    fn upstream(outcome: Outcome, attempts: u32) -> Error {
        Error::Upstream { upstream: "llm".to_string(), outcome, attempts, source: None }
    }

    fn rendered(error: impl Into<WebError>) -> (u16, ErrorBody, Option<u64>) {
        let error = error.into();
        (error.status(), error.body(), error.retry_after_seconds())
    }

    #[test]
    fn a_call_timeout_is_a_504_that_says_it_timed_out() {
        // What a call ends with when its call timeout cut the last attempt (no caller's error).
        let (status, body, retry_after) = rendered(upstream(Outcome::from_transport(TransportError::Timeout), 4));
        assert_eq!((status, body.code, body.upstream_status, retry_after), (504, "upstream_timeout", None, None));
        assert_eq!(body.message, "upstream `llm` timed out: no answer in time (after 4 attempts)");
    }

    #[test]
    fn the_clients_own_timeout_is_a_504_too() {
        let timed_out = std::io::Error::from(std::io::ErrorKind::TimedOut);
        let error: Error<std::io::Error> = Error::Upstream {
            upstream: "llm".to_string(),
            outcome: wavegate::UpstreamError::outcome(&timed_out),
            attempts: 1,
            source: Some(timed_out),
        };
        let (status, body, _) = rendered(error);
        assert_eq!((status, body.code), (504, "upstream_timeout"));
        assert!(body.message.contains("timed out"), "{}", body.message);
    }

    #[test]
    fn other_upstream_failures_stay_502() {
        let now = SystemTime::now();
        for outcome in [
            Outcome::from_transport(TransportError::Connect),
            Outcome::from_transport(TransportError::Reset),
            // The provider's own 504 is an answer, not a timeout of this call.
            Outcome::from_status(504, None, now),
            Outcome::from_status(500, None, now),
            Outcome::from_status(400, None, now),
        ] {
            let (status, body, retry_after) = rendered(upstream(outcome, 2));
            assert_eq!((status, body.code, retry_after), (502, "upstream_error", None), "{outcome}");
            assert_eq!(body.message, upstream(outcome, 2).to_string());
        }
        assert_eq!(rendered(upstream(Outcome::from_status(504, None, now), 1)).1.upstream_status, Some(504));
    }

    #[test]
    fn a_deadline_stays_its_own_504_with_retry_after() {
        let (status, body, retry_after) =
            rendered(Error::<std::convert::Infallible>::DeadlinePassed { upstream: "llm".to_string(), attempts: 2 });
        assert_eq!((status, body.code, retry_after), (504, "deadline_passed", Some(1)));
    }

    #[test]
    fn overloads_are_503_with_retry_after() {
        let waited = Error::<std::convert::Infallible>::WaitedTooLong {
            upstream: "llm".to_string(),
            waited: Duration::from_secs(5),
            retry_after: Some(Duration::from_millis(2_500)),
        };
        let (status, body, retry_after) = rendered(waited);
        assert_eq!((status, body.code, retry_after), (503, "waited_too_long", Some(3)));
        assert_eq!(WebError(Error::Stopped).status(), 503);
    }
}
