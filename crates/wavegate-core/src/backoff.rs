//! Exponential backoff with full jitter.
//!
//! The ceiling doubles with each retry (`base × 2^retry`, capped at `max`) and the actual
//! delay is drawn uniformly from `[0, ceiling]`, so clients that failed together do not retry
//! together. Randomness is passed in, so tests can seed it.
//!
//! ```
//! use std::time::Duration;
//! use rand::{SeedableRng, rngs::StdRng};
//! use wavegate_core::Backoff;
//!
//! let backoff = Backoff::default();
//! assert_eq!(backoff.ceiling(0), Duration::from_millis(200));
//! assert_eq!(backoff.ceiling(3), Duration::from_millis(1_600));
//! assert_eq!(backoff.ceiling(30), Duration::from_secs(10));
//! let delay = backoff.delay(2, &mut StdRng::seed_from_u64(7));
//! assert!(delay <= Duration::from_millis(800));
//! ```

use std::time::Duration;

use rand::Rng;

/// Backoff parameters for transient failures. Validated by
/// [`UpstreamConfigBuilder`](crate::UpstreamConfigBuilder).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    /// The ceiling of the first retry's delay. Default 200 ms.
    pub base: Duration,
    /// The largest ceiling. Default 10 s.
    pub max: Duration,
    /// Retries of transient failures per call (the first attempt not counted). Default 3.
    pub max_retries: u32,
}

impl Default for Backoff {
    fn default() -> Self {
        Self { base: Duration::from_millis(200), max: Duration::from_secs(10), max_retries: 3 }
    }
}

impl Backoff {
    /// The ceiling for retry number `retry` (0 for the first retry).
    pub fn ceiling(&self, retry: u32) -> Duration {
        let factor = 1u32.checked_shl(retry.min(31)).unwrap_or(u32::MAX);
        self.base.saturating_mul(factor).min(self.max)
    }

    /// A delay drawn uniformly from `[0, ceiling(retry)]`.
    pub fn delay<R: Rng + ?Sized>(&self, retry: u32, rng: &mut R) -> Duration {
        self.ceiling(retry).mul_f64(rng.random::<f64>())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand::rngs::StdRng;

    #[test]
    fn full_jitter_spreads_over_the_whole_range() {
        let backoff = Backoff::default();
        let mut rng = StdRng::seed_from_u64(1);
        let delays: Vec<Duration> = (0..2_000).map(|_| backoff.delay(2, &mut rng)).collect();
        let ceiling = backoff.ceiling(2);
        assert!(delays.iter().all(|d| *d <= ceiling));
        let low = delays.iter().filter(|d| **d < ceiling / 4).count();
        let high = delays.iter().filter(|d| **d > ceiling * 3 / 4).count();
        // Uniform: about a quarter each; clustered delays would fail this.
        assert!((400..600).contains(&low), "{low}");
        assert!((400..600).contains(&high), "{high}");
    }

    #[test]
    fn huge_retry_numbers_saturate() {
        let backoff = Backoff::default();
        assert_eq!(backoff.ceiling(u32::MAX), backoff.max);
    }
}
