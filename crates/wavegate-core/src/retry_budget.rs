//! The per-upstream retry budget.
//!
//! Why a budget and not only "at most N retries"? Per-request limits multiply under load: when
//! an upstream fails, every request retries N times and the upstream sees (N + 1) × the
//! traffic exactly when it can take least. A budget caps retries as a share of recent first
//! attempts (default 20 %) plus a small floor (default 10 per second, so a quiet upstream can
//! still retry), counted over a sliding time-to-live (default 10 s) after which deposits
//! expire. A retry the budget refuses ends its request with a typed error instead.
//!
//! ```
//! use wavegate_core::{RetryBudget, RetryBudgetConfig};
//!
//! let mut budget = RetryBudget::new(RetryBudgetConfig { min_per_second: 0, ..Default::default() });
//! for _ in 0..10 {
//!     budget.deposit(0); // ten first attempts
//! }
//! assert!(budget.try_withdraw(0)); // 20 % of 10 = 2 retries
//! assert!(budget.try_withdraw(0));
//! assert!(!budget.try_withdraw(0));
//! assert!(!budget.try_withdraw(10_000)); // the deposits have expired
//! ```

use std::collections::VecDeque;
use std::time::Duration;

use crate::clock::duration_ms;

/// The budget's parameters. Validated by [`UpstreamConfigBuilder`](crate::UpstreamConfigBuilder).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RetryBudgetConfig {
    /// Retries allowed per first attempt, in `[0, 1]`. Default 0.2.
    pub ratio: f64,
    /// Retries allowed per second regardless of traffic. Default 10.
    pub min_per_second: u32,
    /// How long a deposit counts. Default 10 s.
    pub ttl: Duration,
}

impl Default for RetryBudgetConfig {
    fn default() -> Self {
        Self { ratio: 0.2, min_per_second: 10, ttl: Duration::from_secs(10) }
    }
}

/// One upstream's retry budget. Pure: time comes in as milliseconds.
#[derive(Debug, Clone)]
pub struct RetryBudget {
    config: RetryBudgetConfig,
    ttl_ms: u64,
    bucket_ms: u64,
    /// (bucket start, first attempts, retries), oldest first.
    buckets: VecDeque<(u64, u64, u64)>,
}

impl RetryBudget {
    const BUCKETS: u64 = 10;

    /// An empty budget (only the floor is available).
    pub fn new(config: RetryBudgetConfig) -> Self {
        let ttl_ms = duration_ms(config.ttl).max(Self::BUCKETS);
        Self { config, ttl_ms, bucket_ms: ttl_ms / Self::BUCKETS, buckets: VecDeque::new() }
    }

    /// Records a first attempt.
    pub fn deposit(&mut self, now_ms: u64) {
        self.bucket(now_ms).1 += 1;
    }

    /// Takes one retry from the budget if there is one left.
    pub fn try_withdraw(&mut self, now_ms: u64) -> bool {
        if self.remaining(now_ms) < 1.0 {
            return false;
        }
        self.bucket(now_ms).2 += 1;
        true
    }

    /// The retries left now (may be fractional).
    pub fn remaining(&mut self, now_ms: u64) -> f64 {
        self.expire(now_ms);
        let (deposits, withdrawals) = self.buckets.iter().fold((0, 0), |(d, w), b| (d + b.1, w + b.2));
        let floor = f64::from(self.config.min_per_second) * self.ttl_ms as f64 / 1000.0;
        floor + self.config.ratio * deposits as f64 - withdrawals as f64
    }

    fn expire(&mut self, now_ms: u64) {
        let oldest = now_ms.saturating_sub(self.ttl_ms);
        while self.buckets.front().is_some_and(|b| b.0 + self.bucket_ms <= oldest) {
            self.buckets.pop_front();
        }
    }

    fn bucket(&mut self, now_ms: u64) -> &mut (u64, u64, u64) {
        self.expire(now_ms);
        let start = now_ms - now_ms % self.bucket_ms;
        if self.buckets.back().is_none_or(|b| b.0 != start) {
            self.buckets.push_back((start, 0, 0));
        }
        self.buckets.back_mut().expect("a bucket was just pushed")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_floor_allows_retries_without_traffic() {
        let mut budget = RetryBudget::new(RetryBudgetConfig::default());
        let granted = (0..1_000).filter(|_| budget.try_withdraw(0)).count();
        assert_eq!(granted, 100, "10 per second over a 10 s ttl");
    }

    #[test]
    fn retries_stay_a_fraction_of_traffic_under_sustained_load() {
        let mut budget = RetryBudget::new(RetryBudgetConfig { min_per_second: 1, ..Default::default() });
        let (mut firsts, mut retries) = (0u64, 0u64);
        // Every request fails and wants 3 retries, for 60 s.
        for ms in (0..60_000).step_by(10) {
            budget.deposit(ms);
            firsts += 1;
            for _ in 0..3 {
                if budget.try_withdraw(ms) {
                    retries += 1;
                }
            }
        }
        let share = retries as f64 / firsts as f64;
        assert!(share <= 0.2 + 0.02, "retries were {share:.3} of first attempts");
        assert!(share >= 0.15, "the budget should be usable: {share:.3}");
    }
}
