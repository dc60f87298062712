//! Kinds of "too many requests": not every 429 asks for the same answer.
//!
//! | kind | told by | reaction |
//! |---|---|---|
//! | [`Capacity`](RateLimitKind::Capacity) | a 429 while every window the provider reported still had room | the wave's recovery: cut the concurrency (see [`WaveMachine`](crate::WaveMachine)) |
//! | [`RateWindow`](RateLimitKind::RateWindow) | a spent window with a reset (`…-remaining…: 0`), or a rate-limit error code with a `Retry-After` | the fleet pauses until the reset, the concurrency is kept ([`ProviderWindows`](crate::ProviderWindows)) |
//! | [`QuotaExhausted`](RateLimitKind::QuotaExhausted) | 402 Payment Required, or a quota code ([`QUOTA_CODES`](RateLimitKind::QUOTA_CODES): OpenAI's `insufficient_quota`, ...) with a 429 or another 4xx | a typed error at once, no retries; the upstream refuses quickly until a configured time or an operator reset |
//! | [`Overloaded`](RateLimitKind::Overloaded) | 529 (Anthropic's `overloaded_error`), a 503 with `Retry-After` | as a capacity 429: the provider is busy for everyone |
//! | [`Unknown`](RateLimitKind::Unknown) | anything else | the wave's recovery, as for any 429 |
//!
//! Error codes, from the providers' documentation: OpenAI "Error codes" (429 "Rate limit
//! reached for requests" `rate_limit_exceeded`, 429 "You exceeded your current quota"
//! `insufficient_quota`, <https://platform.openai.com/docs/guides/error-codes>); Anthropic
//! "Errors" (429 `rate_limit_error`, 529 `overloaded_error`,
//! <https://docs.anthropic.com/en/api/errors>). Spent quotas: OpenAI's 429 `insufficient_quota`
//! ("You exceeded your current quota, please check your plan and billing details"), Anthropic's
//! 402 `billing_error`, and the spend-limit codes providers and gateways in front of them send
//! (`credit_balance_exhausted`, `organization_spend_limit_exceeded`,
//! `project_spend_limit_exceeded`, `billing_hard_limit_reached`); a 402 Payment Required is
//! one whatever its body says. The body is the caller's to read: pass its code with
//! [`Outcome::with_error_code`](crate::Outcome::with_error_code).
//!
//! Headers outrank the body's wording: some providers call a per-minute limit
//! `insufficient_quota` (LibreChat agents #357), so a 429 that also names a spent window with
//! a reset is a rate window, not a quota.

use crate::signals::ProviderSignals;

/// What kind of refusal a 429 (or a 529, or a 503 with `Retry-After`) is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum RateLimitKind {
    /// Too many at once: the provider's windows had room.
    Capacity,
    /// A request or token window is spent until its reset.
    RateWindow,
    /// The account's quota (billing) is exhausted: retrying cannot help.
    QuotaExhausted,
    /// The provider is overloaded for everyone (529, 503 with `Retry-After`).
    Overloaded,
    /// Nothing said which.
    #[default]
    Unknown,
}

impl RateLimitKind {
    /// Error codes that name a spent quota (with a 429, or another 4xx).
    pub const QUOTA_CODES: &'static [&'static str] = &[
        "insufficient_quota",
        "credit_balance_exhausted",
        "organization_spend_limit_exceeded",
        "project_spend_limit_exceeded",
        "billing_hard_limit_reached",
        "billing_error",
    ];
    /// Error codes that name a rate limit.
    pub const RATE_CODES: &'static [&'static str] = &["rate_limit_exceeded", "rate_limit_error"];
    /// Error codes that name an overload.
    pub const OVERLOAD_CODES: &'static [&'static str] = &["overloaded_error"];

    /// Tells the kind of a refusal from its status, the body's error code (if the caller read
    /// it) and the response's signals.
    ///
    /// ```
    /// use std::time::Duration;
    /// use wavegate_core::{ProviderSignals, RateLimitKind, Window};
    ///
    /// let none = ProviderSignals::default();
    /// assert_eq!(RateLimitKind::classify(429, Some("insufficient_quota"), &none), RateLimitKind::QuotaExhausted);
    /// assert_eq!(RateLimitKind::classify(529, None, &none), RateLimitKind::Overloaded);
    /// let spent = ProviderSignals {
    ///     requests: Window { limit: Some(600), remaining: Some(0), reset: Some(Duration::from_secs(20)), ..Window::NONE },
    ///     ..ProviderSignals::default()
    /// };
    /// assert_eq!(RateLimitKind::classify(429, Some("insufficient_quota"), &spent), RateLimitKind::RateWindow);
    /// assert_eq!(RateLimitKind::classify(429, None, &none), RateLimitKind::Unknown);
    /// ```
    pub fn classify(status: u16, error_code: Option<&str>, signals: &ProviderSignals) -> Self {
        let code = error_code.map(str::trim).unwrap_or("");
        if status == 529 || status == 503 || Self::OVERLOAD_CODES.contains(&code) {
            return RateLimitKind::Overloaded;
        }
        if signals.exhausted_for().is_some() {
            return RateLimitKind::RateWindow;
        }
        if status == 402 || Self::is_quota_code(code) {
            return RateLimitKind::QuotaExhausted;
        }
        if Self::RATE_CODES.contains(&code) && signals.retry_after.is_some() {
            return RateLimitKind::RateWindow;
        }
        let windows = [signals.requests, signals.tokens];
        let reported = windows.iter().filter(|w| w.remaining.is_some()).count();
        if reported > 0 && windows.iter().all(|w| w.remaining.is_none_or(|left| left > 0)) {
            return RateLimitKind::Capacity;
        }
        RateLimitKind::Unknown
    }

    /// Whether `code` (the body's error code or type) names a spent quota.
    pub fn is_quota_code(code: &str) -> bool {
        Self::QUOTA_CODES.contains(&code.trim())
    }

    /// A stable snake_case label for metrics and logs: `capacity`, `rate_window`,
    /// `quota_exhausted`, `overloaded`, `unknown`.
    pub const fn as_str(self) -> &'static str {
        match self {
            RateLimitKind::Capacity => "capacity",
            RateLimitKind::RateWindow => "rate_window",
            RateLimitKind::QuotaExhausted => "quota_exhausted",
            RateLimitKind::Overloaded => "overloaded",
            RateLimitKind::Unknown => "unknown",
        }
    }

    /// Whether the wave's recovery answers it (a cut of the concurrency, maybe a cooldown):
    /// capacity, overload and unknown. A rate window pauses instead; a spent quota stops.
    pub const fn cuts_concurrency(self) -> bool {
        matches!(self, RateLimitKind::Capacity | RateLimitKind::Overloaded | RateLimitKind::Unknown)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::signals::Window;

    #[test]
    fn room_left_in_every_window_is_capacity() {
        let signals = ProviderSignals {
            requests: Window { remaining: Some(10), ..Window::default() },
            tokens: Window { remaining: Some(900), ..Window::default() },
            ..ProviderSignals::default()
        };
        assert_eq!(RateLimitKind::classify(429, None, &signals), RateLimitKind::Capacity);
    }

    #[test]
    fn a_rate_code_needs_a_time_to_be_a_window() {
        let mut signals = ProviderSignals::default();
        assert_eq!(RateLimitKind::classify(429, Some("rate_limit_error"), &signals), RateLimitKind::Unknown);
        signals.retry_after = Some(Duration::from_secs(3));
        assert_eq!(RateLimitKind::classify(429, Some("rate_limit_error"), &signals), RateLimitKind::RateWindow);
    }

    #[test]
    fn a_spent_window_without_any_time_is_not_a_window() {
        let signals = ProviderSignals {
            requests: Window { remaining: Some(0), ..Window::default() },
            ..ProviderSignals::default()
        };
        assert_eq!(RateLimitKind::classify(429, None, &signals), RateLimitKind::Unknown);
    }
}
