//! Limits the provider announces, learned: they tighten the configured budgets, never loosen them.
//!
//! A response's `…-limit-…` value ([`Window::limit`](crate::Window)) says how many requests
//! (or tokens) the provider lets through per window; it is usable only when the window's
//! length is known ([`Window::period`](crate::Window)): the IETF policy's `w=`, or the one
//! minute OpenAI and Anthropic document for their limits (see `signals.rs`). A limit of `L`
//! per window `W` becomes a budget of `L × 60 s ÷ W` a minute with bursts of up to `L`
//! ([`LearnedLimit::budget`]): the provider's own bucket (Anthropic documents a token bucket
//! of that capacity; OpenAI's "resets to its initial state" reads the same way).
//!
//! The rules (the spec tables check both twins, [`LocalGate`](crate::LocalGate) and
//! `lua/learned_limit.lua`):
//!
//! * The budget in force is, per family (requests, tokens), the **tighter of the configured
//!   and the learned one** in each of its two numbers, rate and burst
//!   ([`tightest`]): a learned limit never loosens the configuration. With no budget
//!   configured, a learned limit is the budget (the provider's word is all there is).
//! * The latest report of a limit replaces the one kept (a provider's tier changes both ways;
//!   the configuration stays the ceiling).
//! * A learned limit is kept for [`KEPT_WINDOWS`] of its windows after the last report that
//!   said it, then forgotten: a stale limit does not outlive the provider's silence.
//! * A process in fallback takes its share of the learned budget as of the configured one
//!   ([`Budgets::share`]).
//!
//! ```
//! use wavegate_core::{Budgets, LearnedBudgets, LearnedLimit, LearnedLimits, RateBudget};
//!
//! let configured = Budgets { requests: RateBudget::new(1_000, 20), tokens: None, ..Budgets::default() };
//! let mut learned = LearnedBudgets::default();
//! // "300 requests per minute", at 5 s.
//! let said = LearnedLimits { requests: Some(LearnedLimit { limit: 300, window_ms: 60_000 }), tokens: None, ..LearnedLimits::default() };
//! learned.report(said, 5_000);
//! assert_eq!(learned.effective(configured, 6_000, 1).requests, RateBudget::new(300, 20));
//! // Three minutes without a word: forgotten.
//! assert_eq!(learned.effective(configured, 185_000, 1), configured);
//! ```

use std::time::Duration;

use crate::gcra::{Budgets, RateBudget};
use crate::signals::{ProviderSignals, Window};

/// How many of its windows a learned limit is kept after the last report that said it.
pub const KEPT_WINDOWS: u64 = 3;

/// A limit the provider announced: `limit` units per window of `window_ms`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct LearnedLimit {
    /// Units (requests or tokens) per window, at least 1.
    pub limit: u64,
    /// The window's length in milliseconds, at least 1.
    pub window_ms: u64,
}

impl LearnedLimit {
    /// The limit `window` announces, when it gave its limit and the window's length is known.
    pub fn from_window(window: &Window) -> Option<Self> {
        let limit = window.limit.filter(|l| *l > 0)?;
        let window_ms = u64::try_from(window.period?.as_millis()).unwrap_or(u64::MAX);
        (window_ms > 0).then_some(Self { limit, window_ms })
    }

    /// The budget it means: `limit × 60 000 ÷ window_ms` a minute (rounded down, at least 1),
    /// bursts of up to `limit`; both clamped to `u32::MAX`.
    pub fn budget(&self) -> RateBudget {
        let limit = self.limit.clamp(1, u64::from(u32::MAX));
        let window_ms = self.window_ms.max(1);
        let per_minute = (u128::from(limit) * 60_000 / u128::from(window_ms)).clamp(1, u128::from(u32::MAX));
        let (per_minute, burst) = (per_minute as u32, limit as u32);
        RateBudget::new(per_minute, burst).unwrap_or_else(|| unreachable!("both at least 1"))
    }
}

/// The limits one response announced.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct LearnedLimits {
    /// The requests limit.
    pub requests: Option<LearnedLimit>,
    /// The tokens limit (the tightest token window's; Anthropic's input and output together).
    pub tokens: Option<LearnedLimit>,
    /// The input tokens limit (Anthropic's ITPM), tightening the input tokens budget.
    pub input: Option<LearnedLimit>,
    /// The output tokens limit (Anthropic's OTPM), tightening the output tokens budget.
    pub output: Option<LearnedLimit>,
}

impl LearnedLimits {
    /// What `signals` announce (see [`LearnedLimit::from_window`]).
    pub fn from_signals(signals: &ProviderSignals) -> Self {
        Self {
            requests: LearnedLimit::from_window(&signals.requests),
            tokens: LearnedLimit::from_window(&signals.tokens),
            input: LearnedLimit::from_window(&signals.input),
            output: LearnedLimit::from_window(&signals.output),
        }
    }

    /// Whether nothing was announced.
    pub const fn is_empty(&self) -> bool {
        self.requests.is_none() && self.tokens.is_none() && self.input.is_none() && self.output.is_none()
    }
}

/// A learned limit and until when it is kept (clock milliseconds).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct KeptLimit {
    /// The limit.
    pub limit: LearnedLimit,
    /// When it is forgotten, unless said again.
    pub until_ms: u64,
}

impl KeptLimit {
    fn at(limit: LearnedLimit, now_ms: u64) -> Self {
        Self { limit, until_ms: now_ms.saturating_add(limit.window_ms.saturating_mul(KEPT_WINDOWS)) }
    }

    fn in_force(kept: Option<Self>, now_ms: u64) -> Option<Self> {
        kept.filter(|k| now_ms < k.until_ms)
    }
}

/// The learned limits an upstream keeps, as both twins keep them; see the module docs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct LearnedBudgets {
    /// The requests limit, if one is kept.
    pub requests: Option<KeptLimit>,
    /// The tokens limit, if one is kept.
    pub tokens: Option<KeptLimit>,
    /// The input tokens limit, if one is kept.
    pub input: Option<KeptLimit>,
    /// The output tokens limit, if one is kept.
    pub output: Option<KeptLimit>,
}

impl LearnedBudgets {
    /// Takes in the limits a response announced at `now_ms`: each replaces the one kept.
    pub fn report(&mut self, limits: LearnedLimits, now_ms: u64) {
        for (kept, said) in [
            (&mut self.requests, limits.requests),
            (&mut self.tokens, limits.tokens),
            (&mut self.input, limits.input),
            (&mut self.output, limits.output),
        ] {
            if let Some(limit) = said {
                *kept = Some(KeptLimit::at(limit, now_ms));
            }
        }
    }

    /// The limits still kept at `now_ms`.
    pub fn in_force(&self, now_ms: u64) -> LearnedBudgets {
        LearnedBudgets {
            requests: KeptLimit::in_force(self.requests, now_ms),
            tokens: KeptLimit::in_force(self.tokens, now_ms),
            input: KeptLimit::in_force(self.input, now_ms),
            output: KeptLimit::in_force(self.output, now_ms),
        }
    }

    /// The budgets in force at `now_ms` for a gate holding `1 / share` of the fleet's
    /// budgets (1: all of them): the configured ones tightened by what is learned (the input
    /// and output budgets by Anthropic's input and output limits).
    pub fn effective(&self, configured: Budgets, now_ms: u64, share: u32) -> Budgets {
        let kept = self.in_force(now_ms);
        let budget = |k: Option<KeptLimit>| k.map(|k| k.limit.budget());
        let learned = Budgets {
            requests: budget(kept.requests),
            tokens: budget(kept.tokens),
            input: budget(kept.input),
            output: budget(kept.output),
            ..Budgets::default()
        }
        .share(share);
        Budgets {
            requests: tightest(configured.requests, learned.requests),
            tokens: tightest(configured.tokens, learned.tokens),
            input: tightest(configured.input, learned.input),
            output: tightest(configured.output, learned.output),
            ..configured
        }
    }
}

/// A learned limit as the status shows it: the limit, and how long until it is forgotten.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct LearnedLimitStatus {
    /// The limit the provider announced, with its window.
    pub limit: LearnedLimit,
    /// How long until it is forgotten, unless said again.
    pub forgotten_in: Duration,
}

impl LearnedLimitStatus {
    /// `limit`, forgotten in `forgotten_in` unless said again.
    pub const fn new(limit: LearnedLimit, forgotten_in: Duration) -> Self {
        Self { limit, forgotten_in }
    }
}

/// The learned limits in force, for the status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct LearnedStatus {
    /// The requests limit, if one is kept.
    pub requests: Option<LearnedLimitStatus>,
    /// The tokens limit, if one is kept.
    pub tokens: Option<LearnedLimitStatus>,
    /// The input tokens limit (Anthropic's ITPM), if one is kept.
    pub input: Option<LearnedLimitStatus>,
    /// The output tokens limit (Anthropic's OTPM), if one is kept.
    pub output: Option<LearnedLimitStatus>,
}

impl LearnedStatus {
    /// The requests and the tokens limits kept, each if there is one (no input or output
    /// limit: see [`with_parts`](Self::with_parts)).
    pub const fn new(requests: Option<LearnedLimitStatus>, tokens: Option<LearnedLimitStatus>) -> Self {
        Self { requests, tokens, input: None, output: None }
    }

    /// With the input and output tokens limits kept, each if there is one.
    #[must_use]
    pub const fn with_parts(mut self, input: Option<LearnedLimitStatus>, output: Option<LearnedLimitStatus>) -> Self {
        self.input = input;
        self.output = output;
        self
    }

    /// Each limit with its name as the metrics and the status name it (`requests`, `tokens`,
    /// `input`, `output`).
    pub const fn named(&self) -> [(&'static str, Option<LearnedLimitStatus>); 4] {
        [("requests", self.requests), ("tokens", self.tokens), ("input", self.input), ("output", self.output)]
    }
}

impl LearnedBudgets {
    /// The limits kept at `now_ms`, for the status.
    pub fn status(&self, now_ms: u64) -> LearnedStatus {
        let view = |kept: Option<KeptLimit>| {
            KeptLimit::in_force(kept, now_ms).map(|k| LearnedLimitStatus {
                limit: k.limit,
                forgotten_in: Duration::from_millis(k.until_ms - now_ms),
            })
        };
        LearnedStatus {
            requests: view(self.requests),
            tokens: view(self.tokens),
            input: view(self.input),
            output: view(self.output),
        }
    }
}

/// The tighter of two budgets in each number (rate and burst); either alone when the other
/// is absent.
pub fn tightest(a: Option<RateBudget>, b: Option<RateBudget>) -> Option<RateBudget> {
    match (a, b) {
        (Some(a), Some(b)) => RateBudget::new(a.per_minute().min(b.per_minute()), a.burst().min(b.burst())),
        (a, b) => a.or(b),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limit(limit: u64, window_ms: u64) -> LearnedLimit {
        LearnedLimit { limit, window_ms }
    }

    #[test]
    fn a_limit_per_window_is_a_budget_per_minute() {
        assert_eq!(limit(300, 60_000).budget(), RateBudget::new(300, 300).unwrap());
        assert_eq!(limit(10, 2_000).budget(), RateBudget::new(300, 10).unwrap());
        assert_eq!(limit(10, 7_000).budget(), RateBudget::new(85, 10).unwrap(), "rounded down: tighter");
        assert_eq!(limit(1, 86_400_000).budget(), RateBudget::new(1, 1).unwrap(), "at least one a minute");
        assert_eq!(limit(u64::MAX, 1).budget(), RateBudget::new(u32::MAX, u32::MAX).unwrap(), "clamped");
    }

    #[test]
    fn never_looser_than_the_configuration() {
        let configured =
            Budgets { requests: RateBudget::new(100, 2), tokens: RateBudget::new(10_000, 5_000), ..Budgets::default() };
        let mut learned = LearnedBudgets::default();
        learned.report(
            LearnedLimits {
                requests: Some(limit(300, 60_000)),
                tokens: Some(limit(1_000, 60_000)),
                ..LearnedLimits::default()
            },
            0,
        );
        let effective = learned.effective(configured, 1, 1);
        assert_eq!(effective.requests, configured.requests);
        assert_eq!(effective.tokens, RateBudget::new(1_000, 1_000));
        // A fallback's share divides the learned budget as it does the configured one.
        assert_eq!(learned.effective(Budgets::default(), 1, 4).requests, RateBudget::new(75, 75));
    }

    #[test]
    fn the_latest_report_replaces_and_silence_forgets() {
        let mut learned = LearnedBudgets::default();
        learned.report(LearnedLimits { requests: Some(limit(10, 1_000)), tokens: None, ..LearnedLimits::default() }, 0);
        learned
            .report(LearnedLimits { requests: Some(limit(20, 1_000)), tokens: None, ..LearnedLimits::default() }, 500);
        assert_eq!(learned.effective(Budgets::default(), 600, 1).requests, RateBudget::new(1_200, 20));
        assert_eq!(learned.effective(Budgets::default(), 3_499, 1).requests, RateBudget::new(1_200, 20));
        assert_eq!(learned.effective(Budgets::default(), 3_500, 1), Budgets::default());
    }

    #[test]
    fn only_a_known_window_teaches_anything() {
        let mut window = Window { limit: Some(600), ..Window::default() };
        assert_eq!(LearnedLimit::from_window(&window), None, "a limit without its window's length");
        window.period = Some(std::time::Duration::from_secs(60));
        assert_eq!(LearnedLimit::from_window(&window), Some(limit(600, 60_000)));
        window.limit = Some(0);
        assert_eq!(LearnedLimit::from_window(&window), None);
    }
}
