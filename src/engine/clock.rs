//! The engine's one clock: tokio's.
//!
//! Every deadline, wait and timer of the engine is a [`tokio::time::Instant`] (the actors'
//! timers are tokio's too), and the milliseconds the in-process gate and the breaker take come
//! from the same clock ([`EngineClock`]). So tokio's paused time (`tokio::time::pause()` on a
//! current-thread runtime, e.g. under `#[actix::test]`) drives the whole engine: a test of a
//! 30 s cooldown advances time instead of sleeping.

use std::time::Duration;

pub(crate) use tokio::time::Instant;
use wavegate_core::{Clock, duration_ms};

/// Milliseconds on the engine's clock since it was made.
#[derive(Debug, Clone, Copy)]
pub(crate) struct EngineClock {
    origin: Instant,
}

impl EngineClock {
    pub(crate) fn new() -> Self {
        Self { origin: Instant::now() }
    }

    /// The instant `ms` of this clock's milliseconds stand for (the exact millisecond, not the
    /// truncated reading of a later instant).
    pub(crate) fn instant_at(&self, ms: u64) -> Instant {
        after(self.origin, Duration::from_millis(ms))
    }

    /// `at` in this clock's milliseconds (0 before its origin).
    pub(crate) fn ms_at(&self, at: Instant) -> u64 {
        duration_ms(at.saturating_duration_since(self.origin))
    }
}

impl Clock for EngineClock {
    fn now_ms(&self) -> u64 {
        self.ms_at(Instant::now())
    }
}

/// `deadline` (a caller's `std::time::Instant`) on the engine's clock.
pub(crate) fn from_std(deadline: std::time::Instant) -> Instant {
    Instant::from_std(deadline)
}

/// `now + after`, saturating far in the future instead of overflowing.
pub(crate) fn after(now: Instant, after: Duration) -> Instant {
    now.checked_add(after).unwrap_or_else(|| now + Duration::from_secs(100 * 365 * 24 * 3600))
}
