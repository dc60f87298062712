//! What the caller's own result means for the scheduler.
//!
//! A call's closure returns the caller's own `Result<T, E>`: a `reqwest::Response`, a parsed
//! body, an `io::Error`, an error enum of the application. wavegate does not ask for a special
//! type; it asks a [`Classify`] what the result means (an [`Outcome`]: success, 429, transient,
//! ...), the way tower's retry policy looks at `&Result<Res, E>`. The result itself comes back
//! untouched:
//!
//! * a result classified as a success, or as a failure that is not retried, is returned as it
//!   is — `Ok(value)` stays `Ok(value)` (a final 400 response with its body, say), `Err(e)`
//!   becomes an [`ErrorKind::Upstream`](crate::ErrorKind::Upstream) error holding `e`
//!   ([`Error::source_error`](crate::Error::source_error));
//! * a result classified as a 429 or a transient failure is dropped and the call retried (a
//!   429 through a new permit, a transient failure with backoff inside the retry budget);
//!   when no retry is left the last one comes back as above.
//!
//! Classifiers:
//!
//! * [`ByError`] (the default): `Ok` is a success; an error says what it means through
//!   [`UpstreamError`] (implemented by [`Outcome`] itself, `std::io::Error`, and with the
//!   `reqwest` feature `reqwest::Error`);
//! * [`ByStatus`] (features `http`, `reqwest`): `Ok(response)` is classified by its status and
//!   `Retry-After` (`Outcome::from_response`), an error as by [`ByError`];
//! * any `Fn(&Result<T, E>) -> Outcome`.
//!
//! ```
//! use std::time::SystemTime;
//! use wavegate::{Classify, Outcome, TransportError};
//!
//! #[derive(Debug)]
//! enum AppError { Status(u16, Option<String>), Network }
//!
//! let classify = |result: &Result<String, AppError>| match result {
//!     Ok(_) => Outcome::success(200),
//!     Err(AppError::Status(status, retry_after)) => {
//!         Outcome::from_status(*status, retry_after.as_deref(), SystemTime::now())
//!     }
//!     Err(AppError::Network) => Outcome::from_transport(TransportError::Connect),
//! };
//! let rate_limited = Err(AppError::Status(429, Some("2".into())));
//! assert!(matches!(classify.classify(&rate_limited), Outcome::RateLimited { .. }));
//! ```

use wavegate_core::{Outcome, TransportError};

/// Tells what one attempt's result means: a success, a 429, a transient failure, ...
///
/// Implemented for every `Fn(&Result<T, E>) -> Outcome`, for [`ByError`] and (features `http`,
/// `reqwest`) for [`ByStatus`].
///
/// `ByStatus` knows two response types: http 1's `http::Response<B>` and reqwest 0.13's
/// `reqwest::Response`. A `reqwest::Response` from another version of reqwest (0.12, say) is
/// another type with the same name; classify it with a closure (its status and headers are
/// http 1's, so `Outcome::from_head` reads them).
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot classify a call that returns `Result<{T}, {E}>`",
    label = "`{Self}` is not a `Classify<{T}, {E}>`",
    note = "`ByStatus` classifies `http::Response<B>` (http 1, feature `http`) and reqwest 0.13's `reqwest::Response` \
            (feature `reqwest`); a `reqwest::Response` from another reqwest version (0.12, say) is a different type \
            with the same name",
    note = "classify it with a closure, any `Fn(&Result<T, E>) -> Outcome`: `Ok(response)` as \
            `Outcome::from_head(response.status(), response.headers())` (feature `http`), an error as \
            `Outcome::from_transport(..)`"
)]
pub trait Classify<T, E> {
    /// The outcome of one attempt.
    fn classify(&self, result: &Result<T, E>) -> Outcome;
}

impl<T, E, F> Classify<T, E> for F
where
    F: Fn(&Result<T, E>) -> Outcome,
{
    fn classify(&self, result: &Result<T, E>) -> Outcome {
        self(result)
    }
}

/// An error type that knows what it means for the upstream: a 429, a transient failure, ...
///
/// ```
/// use wavegate::{Outcome, TransportError, UpstreamError};
///
/// struct Refused;
/// impl UpstreamError for Refused {
///     fn outcome(&self) -> Outcome {
///         Outcome::from_transport(TransportError::Connect)
///     }
/// }
/// assert!(Refused.outcome().is_retryable());
/// ```
#[diagnostic::on_unimplemented(
    message = "`{Self}` does not tell wavegate what a failed attempt means (it is not an `UpstreamError`)",
    label = "not an `UpstreamError`",
    note = "the default classifier (`ByError`, and `ByStatus` for errors) asks the error: `UpstreamError` is implemented \
            for `Outcome`, `std::io::Error` and reqwest 0.13's `reqwest::Error` (feature `reqwest`; a `reqwest::Error` \
            from another reqwest version is a different type with the same name)",
    note = "implement `UpstreamError` for your error, or classify the result with a closure, any \
            `Fn(&Result<T, E>) -> Outcome`, through `.classify(..)`"
)]
pub trait UpstreamError {
    /// The outcome of an attempt that failed with this error.
    fn outcome(&self) -> Outcome;
}

impl UpstreamError for Outcome {
    fn outcome(&self) -> Outcome {
        *self
    }
}

/// An I/O error is a transport failure: `TimedOut` a timeout, `ConnectionRefused`,
/// `AddrNotAvailable`, `NotConnected` and `HostUnreachable`-like failures a connect error,
/// anything else (reset, aborted, broken pipe, an early end of file, bad data) a reset.
impl UpstreamError for std::io::Error {
    fn outcome(&self) -> Outcome {
        use std::io::ErrorKind;
        let error = match self.kind() {
            ErrorKind::TimedOut => TransportError::Timeout,
            ErrorKind::ConnectionRefused | ErrorKind::AddrNotAvailable | ErrorKind::NotConnected => {
                TransportError::Connect
            }
            _ => TransportError::Reset,
        };
        Outcome::from_transport(error)
    }
}

/// An error that cannot happen (a service that never fails).
impl UpstreamError for std::convert::Infallible {
    fn outcome(&self) -> Outcome {
        match *self {}
    }
}

impl<E: UpstreamError + ?Sized> UpstreamError for Box<E> {
    fn outcome(&self) -> Outcome {
        (**self).outcome()
    }
}

/// The default classifier: `Ok(_)` is a success (200), an error tells its own outcome
/// ([`UpstreamError`]).
#[derive(Debug, Clone, Copy, Default)]
pub struct ByError;

impl<T, E: UpstreamError> Classify<T, E> for ByError {
    fn classify(&self, result: &Result<T, E>) -> Outcome {
        match result {
            Ok(_) => Outcome::success(200),
            Err(error) => error.outcome(),
        }
    }
}

/// Classifies an `Ok` HTTP response by its status and `Retry-After`
/// (`Outcome::from_response`, `Outcome::from_head`), an error as [`ByError`] does. For
/// `http::Response<B>` (feature `http`) and `reqwest::Response` (feature `reqwest`).
///
/// ```
/// # #[cfg(feature = "http")] {
/// use wavegate::{ByStatus, Classify, Outcome};
///
/// let busy = http::Response::builder().status(503).header("retry-after", "1").body(()).unwrap();
/// let outcome = ByStatus.classify(&Ok::<_, Outcome>(busy));
/// assert!(outcome.is_retryable());
/// # }
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct ByStatus;

#[cfg(feature = "http")]
impl<B, E: UpstreamError> Classify<http::Response<B>, E> for ByStatus {
    fn classify(&self, result: &Result<http::Response<B>, E>) -> Outcome {
        match result {
            Ok(response) => Outcome::from_response(response),
            Err(error) => error.outcome(),
        }
    }
}

#[cfg(feature = "reqwest")]
impl<E: UpstreamError> Classify<reqwest::Response, E> for ByStatus {
    fn classify(&self, result: &Result<reqwest::Response, E>) -> Outcome {
        match result {
            Ok(response) => Outcome::from_head(response.status(), response.headers()),
            Err(error) => error.outcome(),
        }
    }
}

/// A reqwest error (feature `reqwest`): a timeout, a connect failure, an error status (from
/// `error_for_status`, without its `Retry-After`, which reqwest drops: classify the response
/// with [`ByStatus`] to keep it), a body or decode failure, ...
///
/// | error | outcome |
/// |---|---|
/// | `is_timeout()` | transient: timeout |
/// | `is_connect()` | transient: connect |
/// | `status()` is some | as that status |
/// | `is_decode()`, `is_builder()`, `is_redirect()` | unexpected (not retried, not a breaker failure) |
/// | anything else (request, body) | transient: reset |
#[cfg(feature = "reqwest")]
impl UpstreamError for reqwest::Error {
    fn outcome(&self) -> Outcome {
        if self.is_timeout() {
            Outcome::from_transport(TransportError::Timeout)
        } else if self.is_connect() {
            Outcome::from_transport(TransportError::Connect)
        } else if let Some(status) = self.status() {
            Outcome::from_status(status.as_u16(), None, std::time::SystemTime::now())
        } else if self.is_decode() || self.is_builder() || self.is_redirect() {
            Outcome::Unexpected { status: 0 }
        } else {
            Outcome::from_transport(TransportError::Reset)
        }
    }
}

/// How many tokens a successful call really used, read from its value (for an upstream with
/// a tokens-per-minute budget): the difference with the reservation is refunded or charged.
///
/// Implemented for every `Fn(&T) -> u64` and for [`Reserved`] (the default: the reservation
/// stands).
pub trait Meter<T> {
    /// The tokens used by the call that returned `value`, `reserved` having been reserved.
    fn tokens_used(&self, value: &T, reserved: u64) -> u64;
}

impl<T, F> Meter<T> for F
where
    F: Fn(&T) -> u64,
{
    fn tokens_used(&self, value: &T, _reserved: u64) -> u64 {
        self(value)
    }
}

/// The default [`Meter`]: a call used what it reserved.
#[derive(Debug, Clone, Copy, Default)]
pub struct Reserved;

impl<T> Meter<T> for Reserved {
    fn tokens_used(&self, _value: &T, reserved: u64) -> u64 {
        reserved
    }
}
