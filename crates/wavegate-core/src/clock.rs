//! Time, passed in from outside.
//!
//! Every policy in this crate takes the current time as an argument in milliseconds, so the
//! same code runs against Redis `TIME` (shared mode), a monotonic clock (local mode) or a
//! [`ManualClock`] in tests. Nothing here reads the system clock on its own.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// A source of the current time in milliseconds.
///
/// Only differences between two readings of the same clock are meaningful; the origin is the
/// clock's own.
pub trait Clock: Send + Sync {
    /// The current time in milliseconds since the clock's origin.
    fn now_ms(&self) -> u64;
}

/// A monotonic clock whose origin is the moment it was created.
#[derive(Debug, Clone, Copy)]
pub struct MonotonicClock {
    origin: Instant,
}

impl MonotonicClock {
    /// A clock that reads 0 now and counts up.
    pub fn new() -> Self {
        Self { origin: Instant::now() }
    }
}

impl Default for MonotonicClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for MonotonicClock {
    fn now_ms(&self) -> u64 {
        duration_ms(self.origin.elapsed())
    }
}

/// A clock that only moves when told to; clones share the same time.
///
/// ```
/// use std::time::Duration;
/// use wavegate_core::{Clock, ManualClock};
///
/// let clock = ManualClock::new(1_000);
/// clock.advance(Duration::from_secs(5));
/// assert_eq!(clock.now_ms(), 6_000);
/// ```
#[derive(Debug, Clone, Default)]
pub struct ManualClock {
    now: Arc<AtomicU64>,
}

impl ManualClock {
    /// A clock that reads `start_ms`.
    pub fn new(start_ms: u64) -> Self {
        Self { now: Arc::new(AtomicU64::new(start_ms)) }
    }

    /// Moves the clock forward.
    pub fn advance(&self, by: Duration) {
        self.now.fetch_add(duration_ms(by), Ordering::SeqCst);
    }

    /// Sets the clock to `now_ms` (which may go backwards, to test clock skew).
    pub fn set(&self, now_ms: u64) {
        self.now.store(now_ms, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> u64 {
        self.now.load(Ordering::SeqCst)
    }
}

/// A duration in whole milliseconds, saturating at `u64::MAX`.
pub fn duration_ms(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}
