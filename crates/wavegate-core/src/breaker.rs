//! The per-upstream circuit breaker: closed, open, half-open.
//!
//! * **Closed**: calls pass. Results are counted in a sliding time window; once the window
//!   holds at least `minimum_calls` results and the failure rate reaches `failure_rate`, the
//!   breaker opens.
//! * **Open**: calls are refused until `open_for` has passed, with the time to come back.
//! * **Half-open**: up to `half_open_probes` calls are let through. If they all succeed the
//!   breaker closes; the first failure opens it again. Probes whose results never come back
//!   (a caller that went away) do not hold the breaker half-open forever: once every slot is
//!   taken and `probe_timeout` has passed since the last probe was let through, a new round of
//!   probes starts (late results of the old round are ignored).
//!
//! Only [`CallResult::Failure`] (5xx, connect errors, resets, timeouts) counts against the
//! upstream. A 429 is [`CallResult::Ignored`]: it belongs to the wave machine, and an upstream
//! that is merely busy must not be declared down.
//!
//! ```
//! use std::time::Duration;
//! use wavegate_core::{BreakerConfig, CallResult, CircuitBreaker};
//!
//! let mut breaker = CircuitBreaker::new(BreakerConfig::default());
//! for _ in 0..10 {
//!     let ticket = breaker.admit(0).unwrap();
//!     breaker.record(ticket, CallResult::Failure, 0);
//! }
//! let open = breaker.admit(1).unwrap_err();
//! assert_eq!(open.retry_at_ms, BreakerConfig::default().open_for.as_millis() as u64);
//! ```

use std::collections::VecDeque;
use std::fmt;
use std::time::Duration;

use crate::clock::duration_ms;

/// How a finished call counts for the breaker.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CallResult {
    /// The upstream answered well.
    Success,
    /// The upstream failed (5xx, transport error, timeout).
    Failure,
    /// Not the upstream's health: 429, client errors, cancelled calls.
    Ignored,
}

/// The breaker's parameters. Validated by
/// [`UpstreamConfigBuilder`](crate::UpstreamConfigBuilder).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BreakerConfig {
    /// Failure share in `(0, 1]` at which the breaker opens. Default 0.5.
    pub failure_rate: f64,
    /// Results the window must hold before the rate is trusted. Default 10.
    pub minimum_calls: u32,
    /// The sliding window. Default 10 s.
    pub window: Duration,
    /// How long the breaker stays open. Default 5 s.
    pub open_for: Duration,
    /// Calls let through while half-open. Default 3.
    pub half_open_probes: u32,
    /// How long the half-open probes may keep every slot without a result before a new round
    /// starts. Default 60 s.
    pub probe_timeout: Duration,
}

impl Default for BreakerConfig {
    fn default() -> Self {
        Self {
            failure_rate: 0.5,
            minimum_calls: 10,
            window: Duration::from_secs(10),
            open_for: Duration::from_secs(5),
            half_open_probes: 3,
            probe_timeout: Duration::from_secs(60),
        }
    }
}

/// The breaker's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BreakerState {
    /// Calls pass.
    Closed,
    /// Calls are refused until `until_ms`.
    Open {
        /// When the breaker turns half-open.
        until_ms: u64,
    },
    /// A few probe calls pass.
    HalfOpen {
        /// Probes let through so far.
        admitted: u32,
        /// Probes that succeeded.
        succeeded: u32,
    },
}

impl BreakerState {
    /// `closed`, `open` or `half_open`.
    pub const fn as_str(&self) -> &'static str {
        match self {
            BreakerState::Closed => "closed",
            BreakerState::Open { .. } => "open",
            BreakerState::HalfOpen { .. } => "half_open",
        }
    }
}

/// Proof that a call was admitted; hand it back with the result.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use = "give the ticket back to `CircuitBreaker::record` with the call's result"]
pub struct BreakerTicket {
    probe: bool,
    generation: u64,
}

/// The breaker refused the call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("circuit breaker open; try again at {retry_at_ms} ms")]
pub struct BreakerOpen {
    /// When a call may be admitted again (the end of the open period, or now when half-open
    /// probes are all taken and only their results can decide).
    pub retry_at_ms: u64,
}

/// A change of breaker state, for logs and metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BreakerTransition {
    /// The state before.
    pub from: &'static str,
    /// The state after.
    pub to: &'static str,
}

impl fmt::Display for BreakerTransition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} → {}", self.from, self.to)
    }
}

/// One upstream's circuit breaker. Pure: time comes in as milliseconds.
#[derive(Debug, Clone)]
pub struct CircuitBreaker {
    config: BreakerConfig,
    state: BreakerState,
    window: SlidingCounts,
    /// Bumped on every state change, so results of calls admitted before it are not taken as
    /// evidence about the new state.
    generation: u64,
    /// When the last half-open probe was let through.
    last_probe_ms: u64,
}

impl CircuitBreaker {
    /// A closed breaker.
    pub fn new(config: BreakerConfig) -> Self {
        Self {
            window: SlidingCounts::new(config.window),
            config,
            state: BreakerState::Closed,
            generation: 0,
            last_probe_ms: 0,
        }
    }

    /// The current state, as last updated.
    pub fn state(&self) -> BreakerState {
        self.state
    }

    /// Asks to make one call.
    pub fn admit(&mut self, now_ms: u64) -> Result<BreakerTicket, BreakerOpen> {
        if let BreakerState::Open { until_ms } = self.state {
            if now_ms < until_ms {
                return Err(BreakerOpen { retry_at_ms: until_ms });
            }
            self.change(BreakerState::HalfOpen { admitted: 0, succeeded: 0 });
        }
        match &mut self.state {
            BreakerState::Closed => Ok(BreakerTicket { probe: false, generation: self.generation }),
            BreakerState::HalfOpen { admitted, .. } => {
                if *admitted >= self.config.half_open_probes {
                    let stale_at = self.last_probe_ms.saturating_add(duration_ms(self.config.probe_timeout));
                    if now_ms < stale_at {
                        return Err(BreakerOpen { retry_at_ms: now_ms });
                    }
                    // The probes' results are not coming back: a new round.
                    self.change(BreakerState::HalfOpen { admitted: 0, succeeded: 0 });
                }
                if let BreakerState::HalfOpen { admitted, .. } = &mut self.state {
                    *admitted += 1;
                }
                self.last_probe_ms = now_ms;
                Ok(BreakerTicket { probe: true, generation: self.generation })
            }
            BreakerState::Open { .. } => unreachable!("an open breaker past its deadline turned half-open above"),
        }
    }

    /// Records the result of an admitted call; returns the state change it caused, if any.
    pub fn record(&mut self, ticket: BreakerTicket, result: CallResult, now_ms: u64) -> Option<BreakerTransition> {
        if ticket.generation != self.generation {
            return None;
        }
        match self.state {
            BreakerState::Closed => {
                self.window.add(now_ms, result);
                let (successes, failures) = self.window.totals(now_ms);
                let total = successes + failures;
                let tripped = total >= u64::from(self.config.minimum_calls)
                    && total > 0
                    && failures as f64 >= self.config.failure_rate * total as f64;
                tripped.then(|| self.open(now_ms))
            }
            BreakerState::HalfOpen { admitted, succeeded } if ticket.probe => match result {
                CallResult::Failure => Some(self.open(now_ms)),
                CallResult::Ignored => {
                    self.state = BreakerState::HalfOpen { admitted: admitted.saturating_sub(1), succeeded };
                    None
                }
                CallResult::Success if succeeded + 1 >= self.config.half_open_probes => {
                    self.window = SlidingCounts::new(self.config.window);
                    Some(self.change(BreakerState::Closed))
                }
                CallResult::Success => {
                    self.state = BreakerState::HalfOpen { admitted, succeeded: succeeded + 1 };
                    None
                }
            },
            _ => None,
        }
    }

    fn open(&mut self, now_ms: u64) -> BreakerTransition {
        let until_ms = now_ms.saturating_add(duration_ms(self.config.open_for));
        self.change(BreakerState::Open { until_ms })
    }

    fn change(&mut self, to: BreakerState) -> BreakerTransition {
        let transition = BreakerTransition { from: self.state.as_str(), to: to.as_str() };
        self.state = to;
        self.generation += 1;
        transition
    }
}

/// Success and failure counts over a sliding window, in ten buckets.
#[derive(Debug, Clone)]
struct SlidingCounts {
    window_ms: u64,
    bucket_ms: u64,
    /// (bucket start, successes, failures), oldest first.
    buckets: VecDeque<(u64, u64, u64)>,
}

impl SlidingCounts {
    const BUCKETS: u64 = 10;

    fn new(window: Duration) -> Self {
        let window_ms = duration_ms(window).max(Self::BUCKETS);
        Self { window_ms, bucket_ms: window_ms / Self::BUCKETS, buckets: VecDeque::new() }
    }

    fn add(&mut self, now_ms: u64, result: CallResult) {
        let (success, failure) = match result {
            CallResult::Success => (1, 0),
            CallResult::Failure => (0, 1),
            CallResult::Ignored => return,
        };
        let start = now_ms - now_ms % self.bucket_ms;
        match self.buckets.back_mut() {
            Some(last) if last.0 == start => {
                last.1 += success;
                last.2 += failure;
            }
            _ => self.buckets.push_back((start, success, failure)),
        }
    }

    fn totals(&mut self, now_ms: u64) -> (u64, u64) {
        let oldest = now_ms.saturating_sub(self.window_ms);
        while self.buckets.front().is_some_and(|b| b.0 + self.bucket_ms <= oldest) {
            self.buckets.pop_front();
        }
        self.buckets.iter().fold((0, 0), |(s, f), b| (s + b.1, f + b.2))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(breaker: &mut CircuitBreaker, result: CallResult, now: u64) -> Option<BreakerTransition> {
        let ticket = breaker.admit(now).expect("admitted");
        breaker.record(ticket, result, now)
    }

    #[test]
    fn stays_closed_below_minimum_calls() {
        let mut breaker = CircuitBreaker::new(BreakerConfig::default());
        for _ in 0..9 {
            assert_eq!(call(&mut breaker, CallResult::Failure, 0), None);
        }
        assert_eq!(breaker.state(), BreakerState::Closed);
    }

    #[test]
    fn opens_at_the_failure_rate_and_half_opens_after_open_for() {
        let mut breaker = CircuitBreaker::new(BreakerConfig::default());
        for _ in 0..5 {
            call(&mut breaker, CallResult::Success, 0);
        }
        for _ in 0..4 {
            assert_eq!(call(&mut breaker, CallResult::Failure, 0), None);
        }
        let opened = call(&mut breaker, CallResult::Failure, 0);
        assert_eq!(opened, Some(BreakerTransition { from: "closed", to: "open" }));
        assert_eq!(breaker.admit(4_999), Err(BreakerOpen { retry_at_ms: 5_000 }));
        // Half-open: three probes, the fourth waits for their results.
        let probes: Vec<_> = (0..3).map(|_| breaker.admit(5_000).expect("probe")).collect();
        assert_eq!(breaker.admit(5_000), Err(BreakerOpen { retry_at_ms: 5_000 }));
        assert_eq!(breaker.record(probes[0], CallResult::Success, 5_001), None);
        assert_eq!(breaker.record(probes[1], CallResult::Success, 5_001), None);
        let closed = breaker.record(probes[2], CallResult::Success, 5_001);
        assert_eq!(closed, Some(BreakerTransition { from: "half_open", to: "closed" }));
        // The window starts empty after closing.
        assert_eq!(call(&mut breaker, CallResult::Failure, 5_002), None);
    }

    #[test]
    fn a_failed_probe_reopens() {
        let mut breaker = CircuitBreaker::new(BreakerConfig { minimum_calls: 1, ..Default::default() });
        call(&mut breaker, CallResult::Failure, 0);
        let probe = breaker.admit(5_000).expect("probe");
        let reopened = breaker.record(probe, CallResult::Failure, 5_100);
        assert_eq!(reopened, Some(BreakerTransition { from: "half_open", to: "open" }));
        assert_eq!(breaker.admit(5_200), Err(BreakerOpen { retry_at_ms: 10_100 }));
    }

    #[test]
    fn rate_limits_never_open_it() {
        let mut breaker = CircuitBreaker::new(BreakerConfig { minimum_calls: 1, ..Default::default() });
        for now in 0..1_000 {
            assert_eq!(call(&mut breaker, CallResult::Ignored, now), None);
        }
        assert_eq!(breaker.state(), BreakerState::Closed);
    }

    #[test]
    fn probes_whose_results_never_come_back_do_not_hold_it_half_open_forever() {
        let config = BreakerConfig { minimum_calls: 1, half_open_probes: 2, ..Default::default() };
        let mut breaker = CircuitBreaker::new(config);
        call(&mut breaker, CallResult::Failure, 0);
        let lost: Vec<_> = (0..2).map(|_| breaker.admit(5_000).expect("probe")).collect();
        assert!(breaker.admit(5_001).is_err(), "every probe slot is taken");
        assert!(breaker.admit(5_000 + 59_999).is_err(), "within the probe timeout");
        let fresh = breaker.admit(5_000 + 60_000).expect("a new round of probes after the timeout");
        // A late result of the lost round is no evidence about the new one.
        assert_eq!(breaker.record(lost[0], CallResult::Failure, 65_001), None);
        assert_eq!(breaker.record(fresh, CallResult::Success, 65_002), None);
        let last = breaker.admit(65_003).expect("the second probe of the new round");
        let closed = breaker.record(last, CallResult::Success, 65_004);
        assert_eq!(closed, Some(BreakerTransition { from: "half_open", to: "closed" }));
    }

    #[test]
    fn an_ignored_probe_frees_its_slot() {
        let mut breaker =
            CircuitBreaker::new(BreakerConfig { minimum_calls: 1, half_open_probes: 1, ..Default::default() });
        call(&mut breaker, CallResult::Failure, 0);
        let probe = breaker.admit(5_000).expect("probe");
        assert!(breaker.admit(5_000).is_err());
        breaker.record(probe, CallResult::Ignored, 5_000);
        assert!(breaker.admit(5_000).is_ok());
    }

    #[test]
    fn old_failures_slide_out_of_the_window() {
        let mut breaker = CircuitBreaker::new(BreakerConfig::default());
        for _ in 0..9 {
            call(&mut breaker, CallResult::Failure, 0);
        }
        // 11 s later the nine failures are outside the 10 s window.
        assert_eq!(call(&mut breaker, CallResult::Failure, 11_000), None);
        assert_eq!(breaker.state(), BreakerState::Closed);
    }

    #[test]
    fn results_from_before_a_state_change_are_not_evidence() {
        let mut breaker = CircuitBreaker::new(BreakerConfig { minimum_calls: 1, ..Default::default() });
        let slow = breaker.admit(0).expect("closed");
        call(&mut breaker, CallResult::Failure, 0);
        let probe = breaker.admit(5_000).expect("probe");
        // The slow call admitted while closed succeeds now: it must not close the breaker.
        assert_eq!(breaker.record(slow, CallResult::Success, 5_000), None);
        assert!(matches!(breaker.state(), BreakerState::HalfOpen { .. }));
        assert!(breaker.record(probe, CallResult::Success, 5_000).is_none());
    }
}
