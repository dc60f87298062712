//! The provider's announced windows, as the fleet keeps them: "R left until T".
//!
//! A response that says how many requests (or tokens) are left in the provider's window and
//! when it resets ([`WindowReport`], from [`ProviderSignals`](crate::ProviderSignals)) tells
//! the whole fleet what it may still send. [`ProviderWindows`] keeps that (next to the permits:
//! in Redis in shared mode, `lua/provider_window.lua`; in the [`LocalGate`](crate::LocalGate)
//! in local mode and in a fallback), counts each grant down, and refuses a grant once nothing
//! is left until the window resets — so the next 429 does not happen.
//!
//! The rules (the spec tables check both twins):
//!
//! * A report of `R` left with a reset in `D`: the calls still in flight besides the reporting
//!   one may not be counted by the provider yet, so `R` minus what they cost (one request each;
//!   for tokens, as much as the reporting call reserved each) is what is left. The window ends
//!   at now + `D`.
//! * A window ends at most [`MAX_RESET`] after the report that announced it (a day): no answer
//!   can pause the fleet for longer, and no end reaches the store as a number it cannot return.
//! * A report of the same window (ending within [`SAME_WINDOW_MS`] of the known end) only ever
//!   lowers what is left: responses arrive out of order, and an older answer must not hand back
//!   what a newer one took. A report of a later window replaces the known one, and so does one
//!   that ends earlier: an older answer's end, read on arrival, only ever lies later than the
//!   truth, so an earlier end is the provider's newer word (a 200 saying 999 left for the next
//!   minute ends a pause a `Retry-After` of a day started).
//! * A grant costs one request and its token estimate from what is left while the window runs.
//! * While a window runs with less left than a grant needs, every grant is refused until its
//!   end ([`DenyReason::ProviderWindow`](crate::DenyReason::ProviderWindow)); a window whose
//!   end has passed says nothing any more.
//!
//! ```
//! use wavegate_core::{ProviderWindows, WindowReport};
//!
//! let mut windows = ProviderWindows::default();
//! // "0 requests left, the window resets in 30 s", with nobody else in flight.
//! let spent = WindowReport::spent_for(std::time::Duration::from_secs(30));
//! windows.report(spent, 1_000, 0, 0);
//! assert_eq!(windows.wait_ms(2_000, 0), Some(29_000));
//! assert_eq!(windows.wait_ms(31_000, 0), None);
//! ```

use std::time::Duration;

use crate::clock::duration_ms;
use crate::learned_limit::LearnedLimits;
use crate::signals::{MAX_RESET, ProviderSignals};

/// How far a report's window end may lie past the known one and still be the same window:
/// RFC 3339 resets (Anthropic) are often whole seconds, so one window's end is read up to a
/// second apart.
pub const SAME_WINDOW_MS: u64 = 1_000;

/// The longest a window runs after the report that announced it, in milliseconds: [`MAX_RESET`].
pub const MAX_WINDOW_MS: u64 = MAX_RESET.as_secs() * 1_000;

/// The most a window can have left: more than any provider announces, and a number every
/// twin (Lua's doubles included) keeps exactly.
pub const MAX_WINDOW_LEFT: u64 = 1_000_000_000_000_000;

/// What is left of one window, relative to the response that said it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct WindowLeft {
    /// Requests (or tokens) left.
    pub remaining: u64,
    /// Milliseconds from the response until the window resets.
    pub reset_ms: u64,
}

/// What one response said is left of the provider's requests and tokens windows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct WindowReport {
    /// The requests window, when the response gave its remaining count and reset.
    pub requests: Option<WindowLeft>,
    /// The tokens window, likewise.
    pub tokens: Option<WindowLeft>,
    /// The limits the response announced with a known window (they tighten the budgets; see
    /// [`LearnedBudgets`](crate::LearnedBudgets)). Carried with the windows so one report
    /// (one script call in shared mode) says all of it.
    pub limits: LearnedLimits,
}

impl WindowReport {
    /// What `signals` say is left (each window that came with both a remaining count and a
    /// reset) and the limits they announce. `None` when they said neither.
    pub fn from_signals(signals: &ProviderSignals) -> Option<Self> {
        let left = |w: crate::signals::Window| {
            w.left().map(|(remaining, reset)| WindowLeft { remaining, reset_ms: duration_ms(reset) })
        };
        let report = Self {
            requests: left(signals.requests),
            tokens: left(signals.tokens),
            limits: LearnedLimits::from_signals(signals),
        };
        (!report.is_empty()).then_some(report)
    }

    /// A spent requests window for `reset` (a rate-window 429 that named no window), at most
    /// [`MAX_RESET`].
    pub fn spent_for(reset: Duration) -> Self {
        Self {
            requests: Some(WindowLeft { remaining: 0, reset_ms: duration_ms(reset.min(MAX_RESET)) }),
            tokens: None,
            limits: LearnedLimits::default(),
        }
    }

    /// Whether the report says nothing.
    pub const fn is_empty(&self) -> bool {
        self.requests.is_none() && self.tokens.is_none() && self.limits.is_empty()
    }
}

/// One tracked window: what is left until when (clock milliseconds; 0: none known).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub struct TrackedWindow {
    /// What is left.
    pub left: u64,
    /// When the window ends, in clock milliseconds (0: no window known).
    pub until_ms: u64,
}

impl TrackedWindow {
    fn runs(&self, now_ms: u64) -> bool {
        now_ms < self.until_ms
    }

    fn report(&mut self, left: WindowLeft, now_ms: u64, others_cost: u64) {
        let until = now_ms.saturating_add(left.reset_ms.min(MAX_WINDOW_MS));
        let estimate = left.remaining.min(MAX_WINDOW_LEFT).saturating_sub(others_cost);
        if left.reset_ms == 0 {
            // It resets now: nothing to keep.
            return;
        }
        let same = self.runs(now_ms) && until.abs_diff(self.until_ms) <= SAME_WINDOW_MS;
        if same {
            self.left = self.left.min(estimate);
            self.until_ms = self.until_ms.max(until);
        } else {
            *self = TrackedWindow { left: estimate, until_ms: until };
        }
    }

    fn wait_ms(&self, now_ms: u64, need: u64) -> Option<u64> {
        (self.runs(now_ms) && self.left < need).then(|| self.until_ms - now_ms)
    }

    fn charge(&mut self, now_ms: u64, cost: u64) {
        if self.runs(now_ms) {
            self.left = self.left.saturating_sub(cost);
        }
    }
}

/// The provider's requests and tokens windows as the fleet knows them; see the module docs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub struct ProviderWindows {
    /// The requests window.
    pub requests: TrackedWindow,
    /// The tokens window.
    pub tokens: TrackedWindow,
}

impl ProviderWindows {
    /// Takes in a report made at `now_ms` with `others_in_flight` other calls still running,
    /// the reporting call having reserved `tokens_each` tokens (the others are assumed to
    /// cost as much).
    pub fn report(&mut self, report: WindowReport, now_ms: u64, others_in_flight: u32, tokens_each: u64) {
        let others = u64::from(others_in_flight);
        if let Some(left) = report.requests {
            self.requests.report(left, now_ms, others);
        }
        if let Some(left) = report.tokens {
            self.tokens.report(left, now_ms, others.saturating_mul(tokens_each));
        }
    }

    /// How long until a grant reserving `tokens` may be made, when a window refuses it now.
    /// A spent tokens window refuses even a grant that reserves none.
    pub fn wait_ms(&self, now_ms: u64, tokens: u64) -> Option<u64> {
        let requests = self.requests.wait_ms(now_ms, 1);
        let tokens = self.tokens.wait_ms(now_ms, tokens.max(1));
        match (requests, tokens) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        }
    }

    /// Counts a grant reserving `tokens` down from the running windows.
    pub fn charge(&mut self, now_ms: u64, tokens: u64) {
        self.requests.charge(now_ms, 1);
        self.tokens.charge(now_ms, tokens);
    }

    /// Forgets both windows (an operator's clear): grants go on as if no report had come.
    pub fn clear(&mut self) {
        *self = Self::default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn requests(remaining: u64, reset_ms: u64) -> WindowReport {
        WindowReport { requests: Some(WindowLeft { remaining, reset_ms }), ..WindowReport::default() }
    }

    #[test]
    fn the_others_in_flight_are_counted_and_grants_count_down() {
        let mut w = ProviderWindows::default();
        w.report(requests(5, 10_000), 0, 3, 0);
        assert_eq!(w.requests, TrackedWindow { left: 2, until_ms: 10_000 });
        assert_eq!(w.wait_ms(1, 0), None);
        w.charge(1, 0);
        w.charge(2, 0);
        assert_eq!(w.wait_ms(3, 0), Some(9_997));
        assert_eq!(w.wait_ms(10_000, 0), None, "the window ended");
    }

    #[test]
    fn an_older_answer_of_the_same_window_never_raises_what_is_left() {
        let mut w = ProviderWindows::default();
        w.report(requests(3, 10_000), 0, 0, 0);
        w.report(requests(7, 9_500), 400, 0, 0);
        assert_eq!(w.requests.left, 3);
        // A later window replaces it.
        w.report(requests(50, 60_000), 11_000, 0, 0);
        assert_eq!(w.requests, TrackedWindow { left: 50, until_ms: 71_000 });
    }

    #[test]
    fn an_earlier_end_shortens_the_window_and_no_window_outlives_a_day() {
        let mut w = ProviderWindows::default();
        // A Retry-After of a day, then a 200 saying 999 are left for the next minute.
        w.report(WindowReport::spent_for(Duration::from_secs(86_400)), 0, 0, 0);
        assert_eq!(w.wait_ms(1_000, 0), Some(86_399_000));
        w.report(requests(999, 60_000), 2_000, 0, 0);
        assert_eq!(w.requests, TrackedWindow { left: 999, until_ms: 62_000 });
        assert_eq!(w.wait_ms(2_000, 0), None, "the provider's newer word ends the pause");
        // An absurd reset is a day at most, and the end stays a number the store can return.
        w.report(requests(0, u64::MAX), 3_000, 0, 0);
        assert_eq!(w.requests.until_ms, 3_000 + MAX_WINDOW_MS);
        assert_eq!(WindowReport::spent_for(Duration::MAX).requests.map(|r| r.reset_ms), Some(MAX_WINDOW_MS));
        w.clear();
        assert_eq!(w.wait_ms(4_000, 0), None, "cleared");
    }

    #[test]
    fn tokens_need_what_the_grant_reserves() {
        let mut w = ProviderWindows::default();
        let tokens = Some(WindowLeft { remaining: 1_000, reset_ms: 5_000 });
        let report = WindowReport { tokens, ..WindowReport::default() };
        w.report(report, 0, 2, 300);
        assert_eq!(w.tokens.left, 400);
        assert_eq!(w.wait_ms(0, 400), None);
        assert_eq!(w.wait_ms(0, 401), Some(5_000));
        w.charge(0, 400);
        assert_eq!(w.wait_ms(0, 0), Some(5_000), "a spent tokens window refuses every grant");
    }
}
