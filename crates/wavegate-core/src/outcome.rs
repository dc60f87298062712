//! What an upstream call's result means for the scheduler.
//!
//! One classification decides which layer owns the result:
//!
//! | outcome | wave (shared cooldown) | circuit breaker | retried |
//! |---|---|---|---|
//! | 2xx | success | success | — |
//! | 429, 529, 503 with `Retry-After`, 402 (and a 4xx whose code names a spent quota) | by [kind](RateLimitKind): capacity, overload, unknown cut + cooldown; a rate window pauses the fleet until its reset | never counted | through a new permit (a spent quota: never) |
//! | 500, 502, 503, 504, connect, reset, timeout | — | failure | with backoff and full jitter, inside the retry budget and the deadline (an upstream can [opt out](crate::UpstreamConfigBuilder::retry_transient) but for connect errors) |
//! | other 5xx | — | failure | no |
//! | other 4xx | — | ignored | never |
//! | 1xx, 3xx, out of range | — | ignored | never |
//!
//! A 2xx and a 429 also carry what the provider said about its windows
//! ([`ProviderSignals`]): "R left until T" makes the fleet wait until T once nothing is left
//! ([`window_report`](Outcome::window_report)).

use std::time::{Duration, SystemTime};

use crate::breaker::CallResult;
use crate::gate::WaveSignal;
use crate::provider_window::WindowReport;
use crate::rate_limit_kind::RateLimitKind;
use crate::retry_after::parse_retry_after;
use crate::signals::{ProviderSignals, SignalKind, Unreadable};

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
    /// 500, 502, 503 or 504.
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
        /// What the response said about the provider's windows.
        signals: ProviderSignals,
    },
    /// 429 (or 529, or a 503 with `Retry-After`, or a spent quota: a 402, another 4xx whose
    /// error code names one): the provider refused for now; what happens next depends on its
    /// [`kind`](RateLimitKind).
    RateLimited {
        /// The status code: 429, 529, 503, 402 (or another 4xx of a spent quota).
        status: u16,
        /// The provider's `Retry-After`, when it sent a usable one.
        retry_after: Option<Duration>,
        /// What kind of refusal it is.
        kind: RateLimitKind,
        /// What the response said about the provider's windows.
        signals: ProviderSignals,
    },
    /// Worth a retry with backoff: 500, 502, 503, 504 and transport failures. A 500 is
    /// transient: providers answer one for a failure of theirs that the same request again
    /// usually gets past (OpenAI: "Retry your request after a brief wait"; Anthropic's
    /// `api_error`).
    Transient {
        /// Which one.
        kind: Transient,
        /// A `Retry-After` sent with a 500, 502 or 504, when usable.
        retry_after: Option<Duration>,
        /// Signals sent that could not be read (a malformed `Retry-After`).
        unreadable: Unreadable,
    },
    /// Any other 5xx (501, 505, ...): a breaker failure, not retried.
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
    /// A success with `status` and no signals.
    pub const fn success(status: u16) -> Self {
        Outcome::Success { status, signals: ProviderSignals::NONE }
    }

    /// A plain 429 with the given `Retry-After` and nothing else said (kind unknown).
    pub const fn rate_limited(retry_after: Option<Duration>) -> Self {
        let signals = ProviderSignals { retry_after, ..ProviderSignals::NONE };
        Outcome::RateLimited { status: 429, retry_after, kind: RateLimitKind::Unknown, signals }
    }

    /// Classifies an HTTP status with the response's `Retry-After` value, if any.
    /// A malformed `Retry-After` is ignored (the cooldown ladder applies instead) and said in
    /// [`unreadable`](Self::unreadable).
    ///
    /// ```
    /// use std::time::{Duration, SystemTime};
    /// use wavegate_core::{Outcome, RateLimitKind};
    ///
    /// let now = SystemTime::now();
    /// assert_eq!(Outcome::from_status(429, Some("3"), now), Outcome::rate_limited(Some(Duration::from_secs(3))));
    /// let unreadable = Outcome::from_status(429, Some("later"), now);
    /// assert_eq!(unreadable.retry_after(), None);
    /// assert!(!unreadable.unreadable().is_empty());
    /// assert!(Outcome::from_status(503, None, now).is_retryable());
    /// assert_eq!(Outcome::from_status(529, None, now).rate_limit_kind(), Some(RateLimitKind::Overloaded));
    /// assert!(!Outcome::from_status(400, None, now).is_retryable());
    /// ```
    pub fn from_status(status: u16, retry_after: Option<&str>, now: SystemTime) -> Self {
        let mut signals = ProviderSignals::NONE;
        if let Some(value) = retry_after {
            match parse_retry_after(value, now) {
                Ok(delay) => signals.retry_after = Some(delay),
                Err(_) => signals.unreadable.insert(SignalKind::RetryAfter),
            }
        }
        Self::from_signals(status, None, signals)
    }

    /// Classifies an HTTP status with everything read from the response's headers
    /// ([`ProviderSignals::from_headers`]) and the body's error code, if the caller read it
    /// (`insufficient_quota`, `rate_limit_error`, ...; see [`RateLimitKind::classify`]).
    ///
    /// ```
    /// use std::time::SystemTime;
    /// use wavegate_core::{Outcome, ProviderSignals, RateLimitKind};
    ///
    /// let headers = [("x-ratelimit-remaining-requests", "0"), ("x-ratelimit-reset-requests", "12s")];
    /// let signals = ProviderSignals::from_headers(headers.iter().map(|(n, v)| (*n, v.as_bytes())), SystemTime::now());
    /// let outcome = Outcome::from_signals(429, None, signals);
    /// assert_eq!(outcome.rate_limit_kind(), Some(RateLimitKind::RateWindow));
    /// assert!(outcome.window_report(std::time::Duration::from_secs(60)).is_some());
    /// ```
    pub fn from_signals(status: u16, error_code: Option<&str>, signals: ProviderSignals) -> Self {
        let retry_after = signals.retry_after;
        let refused = |status| Outcome::RateLimited {
            status,
            retry_after,
            kind: RateLimitKind::classify(status, error_code, &signals),
            signals,
        };
        match status {
            200..=299 => Outcome::Success { status, signals },
            429 | 529 => refused(status),
            // Payment Required: the account's quota is spent, whatever the body says (DESIGN:
            // "a spent quota (402 and the providers' quota codes)"), never a plain client error
            // that the next caller sends again.
            402 => Outcome::RateLimited { status, retry_after, kind: RateLimitKind::QuotaExhausted, signals },
            503 if retry_after.is_some() => refused(status),
            400..=499 if error_code.is_some_and(RateLimitKind::is_quota_code) => refused(status),
            500 | 502..=504 => {
                Outcome::Transient { kind: Transient::Status(status), retry_after, unreadable: signals.unreadable }
            }
            500..=599 => Outcome::ServerError { status },
            400..=499 => Outcome::ClientError { status },
            _ => Outcome::Unexpected { status },
        }
    }

    /// The same outcome told the body's error code (the body is the caller's to read): a 429
    /// whose body says `insufficient_quota` is a spent quota, `rate_limit_error` with a
    /// `Retry-After` a rate window, ... Other outcomes are returned as they are.
    ///
    /// ```
    /// use std::time::SystemTime;
    /// use wavegate_core::{Outcome, RateLimitKind};
    ///
    /// let outcome = Outcome::from_status(429, None, SystemTime::now()).with_error_code("insufficient_quota");
    /// assert_eq!(outcome.rate_limit_kind(), Some(RateLimitKind::QuotaExhausted));
    /// assert!(!outcome.is_retryable());
    /// ```
    ///
    /// A client error whose code names a spent quota (a 400 or 403 that says
    /// `insufficient_quota`, say) becomes a spent quota too; the headers a 4xx sent are not
    /// kept by [`ClientError`](Outcome::ClientError), so build it with
    /// [`from_signals`](Self::from_signals) when they matter.
    pub fn with_error_code(self, code: &str) -> Self {
        match self {
            Outcome::RateLimited { status, signals, .. } => Self::from_signals(status, Some(code), signals),
            Outcome::ClientError { status } if RateLimitKind::is_quota_code(code) => {
                Self::from_signals(status, Some(code), ProviderSignals::NONE)
            }
            other => other,
        }
    }

    /// Classifies an HTTP response by its status and its headers (feature `http`): every
    /// rate-limit header of [`ProviderSignals`], at the current time. Chain
    /// [`with_error_code`](Self::with_error_code) once the body's error code is known.
    ///
    /// ```
    /// use std::time::Duration;
    /// use wavegate_core::Outcome;
    ///
    /// let response = http::Response::builder().status(429).header("retry-after", "2").body(()).unwrap();
    /// assert_eq!(Outcome::from_response(&response).retry_after(), Some(Duration::from_secs(2)));
    /// ```
    #[cfg(feature = "http")]
    pub fn from_response<B>(response: &http::Response<B>) -> Self {
        Self::from_head(response.status(), response.headers())
    }

    /// Classifies a response head — its status and headers, e.g. a `reqwest::Response`'s
    /// `status()` and `headers()` — reading every rate-limit header (feature `http`).
    #[cfg(feature = "http")]
    pub fn from_head(status: http::StatusCode, headers: &http::HeaderMap) -> Self {
        let signals = ProviderSignals::from_headers(
            headers.iter().map(|(name, value)| (name.as_str(), value.as_bytes())),
            SystemTime::now(),
        );
        Self::from_signals(status.as_u16(), None, signals)
    }

    /// Classifies a call that got no status.
    pub fn from_transport(error: TransportError) -> Self {
        Outcome::Transient { kind: Transient::Transport(error), retry_after: None, unreadable: Unreadable::default() }
    }

    /// Whether the scheduler retries this outcome (a 429 through the shared cooldown, a
    /// transient failure with backoff inside the retry budget). A spent quota is never retried.
    /// An upstream that [opts out](crate::UpstreamConfigBuilder::retry_transient) retries only
    /// the transient failures that [never reached the provider](Self::never_sent).
    pub fn is_retryable(&self) -> bool {
        match self {
            Outcome::RateLimited { kind, .. } => *kind != RateLimitKind::QuotaExhausted,
            Outcome::Transient { .. } => true,
            _ => false,
        }
    }

    /// Whether the request provably never reached the provider (the connection could not be
    /// made): safe to send again even for a call that must not run twice.
    pub const fn never_sent(&self) -> bool {
        matches!(self, Outcome::Transient { kind: Transient::Transport(TransportError::Connect), .. })
    }

    /// The provider's `Retry-After`, when the outcome carries a usable one.
    pub const fn retry_after(&self) -> Option<Duration> {
        match self {
            Outcome::RateLimited { retry_after, .. } | Outcome::Transient { retry_after, .. } => *retry_after,
            _ => None,
        }
    }

    /// The kind of a refusal (429, 529, 503 with `Retry-After`); `None` for anything else.
    pub const fn rate_limit_kind(&self) -> Option<RateLimitKind> {
        match self {
            Outcome::RateLimited { kind, .. } => Some(*kind),
            _ => None,
        }
    }

    /// What the response said about the provider's windows, when it was a response with
    /// signals (2xx or a refusal).
    pub const fn signals(&self) -> Option<&ProviderSignals> {
        match self {
            Outcome::Success { signals, .. } | Outcome::RateLimited { signals, .. } => Some(signals),
            _ => None,
        }
    }

    /// The signals the response sent that could not be read.
    pub const fn unreadable(&self) -> Unreadable {
        match self {
            Outcome::Success { signals, .. } | Outcome::RateLimited { signals, .. } => signals.unreadable,
            Outcome::Transient { unreadable, .. } => *unreadable,
            _ => Unreadable::EMPTY,
        }
    }

    /// What is left of the provider's windows, for the fleet ([`ProviderWindows`](crate::ProviderWindows)):
    /// what a 2xx or a refusal reported, and for a rate-window refusal that named no spent
    /// window with a reset, a spent requests window until its `Retry-After`, at most
    /// `retry_after_cap` (the upstream's [`max_cooldown`](crate::UpstreamConfigBuilder::max_cooldown)):
    /// a `Retry-After` alone pauses the fleet no longer than it would cool a wave down.
    ///
    /// ```
    /// use std::time::{Duration, SystemTime};
    /// use wavegate_core::Outcome;
    ///
    /// let day = Outcome::from_status(429, Some("86400"), SystemTime::now()).with_error_code("rate_limit_exceeded");
    /// let report = day.window_report(Duration::from_secs(60)).expect("a pause");
    /// assert_eq!(report.requests.map(|left| left.reset_ms), Some(60_000));
    /// ```
    pub fn window_report(&self, retry_after_cap: Duration) -> Option<WindowReport> {
        // No reservation is known: nothing to give back.
        self.window_report_for(retry_after_cap, 0, 0).map(|report| WindowReport { refused: None, ..report })
    }

    /// [`window_report`](Self::window_report) for a refused call that reserved `tokens`,
    /// `output` of them its answer's: a refusal whose headers show a window with less left than
    /// the call needed (one request, its tokens, its input part, its output part) names the
    /// window that refused it, and that window, tracked, holds back the calls it cannot hold
    /// while the smaller ones go on; only a refusal that names none pauses the fleet for its
    /// `Retry-After`. (An Anthropic refusal of a 2,000-token output with 1,500 left paused
    /// every call for up to 15 s, while the calls of 400 fitted.) A refusal's report says so
    /// ([`WindowReport::refused`]): the provider counted none of the call's reservation.
    pub fn window_report_for(&self, retry_after_cap: Duration, tokens: u64, output: u64) -> Option<WindowReport> {
        match self {
            Outcome::Success { signals, .. } => WindowReport::from_signals(signals),
            Outcome::RateLimited { kind, signals, retry_after, .. } => {
                let report = WindowReport::from_signals(signals);
                let output = output.min(tokens);
                let names_spent = report.is_some_and(|r| {
                    let short =
                        |left: Option<crate::WindowLeft>, need: u64| left.is_some_and(|l| l.remaining < need.max(1));
                    short(r.requests, 1)
                        || short(r.tokens, tokens)
                        || short(r.input, tokens - output)
                        || short(r.output, output)
                });
                let report = match (kind, names_spent, signals.exhausted_for().or(*retry_after)) {
                    (RateLimitKind::RateWindow, false, Some(pause)) => {
                        let mut report = report.unwrap_or_default();
                        report.requests = WindowReport::spent_for(pause.min(retry_after_cap)).requests;
                        Some(report)
                    }
                    _ => report,
                };
                report.map(|report| WindowReport { refused: Some((tokens, output)), ..report })
            }
            _ => None,
        }
    }

    /// What the wave machine learns from it: a capacity, overload or unknown refusal is a
    /// 429 for the wave; a rate window and a spent quota cut nothing.
    pub fn wave_signal(&self) -> WaveSignal {
        match self {
            Outcome::Success { .. } => WaveSignal::Success,
            Outcome::RateLimited { retry_after, kind, .. } if kind.cuts_concurrency() => {
                WaveSignal::RateLimited { retry_after: *retry_after }
            }
            _ => WaveSignal::Neutral,
        }
    }

    /// What the circuit breaker learns from it: a refusal is never a breaker failure.
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
            Outcome::Success { status, .. }
            | Outcome::RateLimited { status, .. }
            | Outcome::ServerError { status }
            | Outcome::ClientError { status }
            | Outcome::Unexpected { status }
            | Outcome::Transient { kind: Transient::Status(status), .. } => Some(*status),
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
            Outcome::RateLimited { status, kind, .. } => write!(f, "{} ({status}, {})", self.label(), kind.as_str()),
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
            // 529 and a 503 with Retry-After are overload: a refusal like a 429.
            if matches!(status, 429 | 503 | 529) {
                assert!(matches!(wave, WaveSignal::RateLimited { .. }), "{status}");
                assert_eq!(breaker, CallResult::Ignored, "a refusal is never a breaker failure");
            } else {
                assert!(!matches!(wave, WaveSignal::RateLimited { .. }), "{status}");
            }
            if (400..500).contains(&status) && status != 429 {
                assert!(!outcome.is_retryable(), "{status} must never be retried");
            }
            if matches!(status, 500 | 502 | 504) {
                assert!(outcome.is_retryable(), "{status}");
                assert_eq!(breaker, CallResult::Failure);
            }
            if (501..600).contains(&status) && !matches!(status, 502..=504 | 529) {
                assert!(!outcome.is_retryable(), "{status} is not transient");
            }
            let without = Outcome::from_status(status, None, now);
            if matches!(status, 500 | 502..=504) {
                assert!(without.is_retryable());
                assert_eq!(without.breaker_result(), CallResult::Failure, "{status}");
            }
        }
    }

    #[test]
    fn kinds_of_refusal_have_their_own_reactions() {
        let now = SystemTime::now();
        let quota = Outcome::from_status(429, Some("20"), now).with_error_code("insufficient_quota");
        assert_eq!(quota.rate_limit_kind(), Some(RateLimitKind::QuotaExhausted));
        assert!(!quota.is_retryable());
        assert_eq!(quota.wave_signal(), WaveSignal::Neutral);
        let window = Outcome::from_status(429, Some("20"), now).with_error_code("rate_limit_exceeded");
        assert_eq!(window.rate_limit_kind(), Some(RateLimitKind::RateWindow));
        assert!(window.is_retryable());
        assert_eq!(window.wave_signal(), WaveSignal::Neutral, "a rate window cuts no concurrency");
        let report = window.window_report(Duration::from_secs(60)).expect("a pause");
        assert_eq!(report.requests.map(|left| (left.remaining, left.reset_ms)), Some((0, 20_000)));
        let capped = window.window_report(Duration::from_secs(5)).expect("a pause");
        assert_eq!(capped.requests.map(|left| left.reset_ms), Some(5_000), "a Retry-After alone is capped");
        let busy = Outcome::from_status(503, Some("2"), now);
        assert_eq!(busy.rate_limit_kind(), Some(RateLimitKind::Overloaded));
        assert_eq!(busy.status(), Some(503));
        assert!(matches!(busy.wave_signal(), WaveSignal::RateLimited { .. }));
        // A 529 keeps its kind whatever the body says.
        let overloaded = Outcome::from_status(529, None, now).with_error_code("insufficient_quota");
        assert_eq!(overloaded.rate_limit_kind(), Some(RateLimitKind::Overloaded));
        assert_eq!(Outcome::success(200).with_error_code("insufficient_quota"), Outcome::success(200));
    }

    #[test]
    fn a_spent_quota_is_recognised_by_402_and_by_the_providers_codes() {
        let now = SystemTime::now();
        let payment = Outcome::from_status(402, None, now);
        assert_eq!(payment.rate_limit_kind(), Some(RateLimitKind::QuotaExhausted), "402 Payment Required");
        assert_eq!(payment.status(), Some(402));
        assert!(!payment.is_retryable());
        assert_eq!((payment.wave_signal(), payment.breaker_result()), (WaveSignal::Neutral, CallResult::Ignored));
        let codes = [
            "insufficient_quota",
            "credit_balance_exhausted",
            "organization_spend_limit_exceeded",
            "project_spend_limit_exceeded",
            "billing_hard_limit_reached",
            "billing_error",
        ];
        for code in codes {
            for status in [429, 400, 403, 402] {
                let outcome = Outcome::from_status(status, None, now).with_error_code(code);
                assert_eq!(outcome.rate_limit_kind(), Some(RateLimitKind::QuotaExhausted), "{status} {code}");
                assert_eq!(outcome.status(), Some(status));
                assert!(!outcome.is_retryable(), "{status} {code}");
            }
        }
        // Other client errors stay client errors, whatever else their body says.
        let invalid = Outcome::from_status(400, None, now).with_error_code("invalid_request_error");
        assert_eq!(invalid, Outcome::ClientError { status: 400 });
        // On a 429, headers that name a spent window with a reset still win over the wording.
        let headers = [("x-ratelimit-remaining-requests", "0"), ("x-ratelimit-reset-requests", "20s")];
        let signals = ProviderSignals::from_headers(headers.iter().map(|(n, v)| (*n, v.as_bytes())), now);
        let outcome = Outcome::from_signals(429, Some("project_spend_limit_exceeded"), signals);
        assert_eq!(outcome.rate_limit_kind(), Some(RateLimitKind::RateWindow));
    }

    #[test]
    fn a_402_is_a_spent_quota_with_or_without_its_code() {
        // Found by the drawn nemesis (seed 1): a 402 was a plain client error, so every
        // caller of every process sent its call again into the spent quota.
        let now = SystemTime::now();
        for outcome in [
            Outcome::from_status(402, None, now),
            Outcome::from_status(402, Some("30"), now).with_error_code("insufficient_quota"),
            Outcome::from_status(402, None, now).with_error_code("rate_limit_exceeded"),
        ] {
            assert_eq!(outcome.rate_limit_kind(), Some(RateLimitKind::QuotaExhausted), "{outcome:?}");
            assert!(!outcome.is_retryable());
            assert_eq!(outcome.wave_signal(), WaveSignal::Neutral, "a spent quota cuts nothing");
            assert_eq!(outcome.breaker_result(), CallResult::Ignored, "nor opens the breaker");
            assert_eq!(outcome.status(), Some(402));
        }
    }

    #[test]
    fn an_unreadable_retry_after_is_said() {
        let now = SystemTime::now();
        for status in [429, 502, 503] {
            let outcome = Outcome::from_status(status, Some("soon"), now);
            assert!(outcome.unreadable().contains(SignalKind::RetryAfter), "{status}");
            assert_eq!(outcome.retry_after(), None);
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
