//! wavegate's errors as HTTP responses (the table is on [`WebError`]).

use std::fmt;

use serde::Serialize;
use wavegate::{Error, ErrorKind};

/// A [`wavegate::Error`] that actix-web (feature `actix-web`) and axum (feature `axum`) render
/// as a response.
/// Handlers return `Result<_, WebError>` and use `?` on scheduler calls.
///
/// | error | status | `Retry-After` |
/// |---|---|---|
/// | waited too long, queue full, breaker open, retry budget spent (overload) | 503 | yes |
/// | deadline passed | 504 | yes |
/// | refused at once: no permit could come before the deadline, as proved ([`Error::needed`]) | 503 | yes (the time it would have needed) |
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
/// {"code":"upstream_timeout","message":"upstream `llm` timed out: no answer within the call timeout (after 4 attempts)"}
/// ```
///
/// The caller's own error inside an [`ErrorKind::Upstream`] error (an `Error<E>`) is not part
/// of the response (it may hold internal details): `?` keeps its outcome and drops it. Handle
/// it before `?` if the end user should see it.
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
                    || matches!(error.kind(), ErrorKind::DeadlinePassed | ErrorKind::QuotaExhausted) =>
            {
                error.retry_after().map(|after| after.as_secs() + u64::from(after.subsec_nanos() > 0)).map(|s| s.max(1))
            }
            _ => None,
        }
    }

    /// The HTTP status of the response (the table above), for any framework.
    pub fn status(&self) -> u16 {
        match self.0.kind() {
            kind if kind.is_overload() => 503,
            // Nothing timed out: the service cannot serve it in time, and says when it could.
            ErrorKind::DeadlinePassed if self.0.needed().is_some() => 503,
            _ if upstream_timed_out(&self.0) => 504,
            ErrorKind::DeadlinePassed => 504,
            ErrorKind::Upstream => 502,
            ErrorKind::Stopped | ErrorKind::QuotaExhausted | ErrorKind::StoreUnavailable => 503,
            _ => 500,
        }
    }

    /// The JSON body.
    pub fn body(&self) -> ErrorBody {
        let code = if upstream_timed_out(&self.0) { "upstream_timeout" } else { self.0.code() };
        ErrorBody {
            code,
            message: self.0.to_string(),
            retry_after_seconds: self.retry_after_seconds(),
            upstream_status: self.0.upstream_status(),
        }
    }
}

/// Whether `error` is an upstream call that timed out: its last attempt was cut by the call
/// timeout, or the caller's client said it timed out. Not a deadline that passed (its own 504,
/// `deadline_passed`), nor a provider's 504 (an answer: 502 with `upstream_status` 504).
fn upstream_timed_out(error: &Error) -> bool {
    error.kind() == ErrorKind::Upstream && error.is_timeout()
}
