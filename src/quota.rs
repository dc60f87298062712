//! Spent quotas: an upstream whose provider said "your quota is exhausted" is refused at once,
//! in this process, until a configured time or an operator's reset.
//!
//! A 429 of kind [`QuotaExhausted`](wavegate_core::RateLimitKind::QuotaExhausted) (OpenAI's
//! `insufficient_quota`) is a billing state, not a rate limit: retrying it only repeats the
//! refusal (langchainjs #1929). The call that met it ends with
//! [`ErrorKind::QuotaExhausted`](crate::ErrorKind::QuotaExhausted) after that one attempt, and
//! every later call of this process is refused before it asks for a permit, for the upstream's
//! [`quota_pause`](wavegate_core::UpstreamConfigBuilder::quota_pause) or until
//! [`Upstream::reset_quota`](crate::Upstream::reset_quota). So a spent quota costs one
//! attempt, not a retry storm. In shared mode the process that met it tells the fleet, and
//! every other process refuses the upstream for the rest of the pause too (`engine/lane/quota.rs`,
//! lifted fleet-wide by `wavegate reset-quota`); in local mode and in fallback each process
//! learns it from its own first attempt.

use std::time::Duration;

use crate::engine::clock::Instant;

use std::sync::{Mutex, MutexGuard, PoisonError};

/// One upstream's spent quota, if any: until when it is refused.
#[derive(Debug, Default)]
pub(crate) struct QuotaBlock {
    until: Mutex<Option<Instant>>,
}

impl QuotaBlock {
    fn lock(&self) -> MutexGuard<'_, Option<Instant>> {
        // Nothing can be left half-written under this lock: a poisoned one is still right.
        self.until.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Refuses the upstream for `pause` from now (a later end is kept).
    pub(crate) fn exhaust(&self, pause: Duration) -> Duration {
        let until = Instant::now() + pause;
        let mut guard = self.lock();
        let until = guard.map_or(until, |known| known.max(until));
        *guard = Some(until);
        until.saturating_duration_since(Instant::now())
    }

    /// How long the upstream stays refused, `None` when it is not.
    pub(crate) fn remaining(&self) -> Option<Duration> {
        let mut guard = self.lock();
        match *guard {
            Some(until) if until > Instant::now() => Some(until - Instant::now()),
            Some(_) => {
                *guard = None;
                None
            }
            None => None,
        }
    }

    /// Lifts the refusal; says whether there was one.
    pub(crate) fn reset(&self) -> bool {
        self.lock().take().is_some_and(|until| until > Instant::now())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refused_until_the_pause_ends_or_a_reset() {
        let block = QuotaBlock::default();
        assert_eq!(block.remaining(), None);
        block.exhaust(Duration::from_secs(60));
        assert!(block.remaining().is_some_and(|left| left > Duration::from_secs(59)));
        // A shorter pause does not shorten a longer one.
        block.exhaust(Duration::from_millis(1));
        assert!(block.remaining().is_some_and(|left| left > Duration::from_secs(59)));
        assert!(block.reset());
        assert_eq!(block.remaining(), None);
        assert!(!block.reset());
        block.exhaust(Duration::ZERO);
        assert_eq!(block.remaining(), None, "a pause that has ended refuses nothing");
    }
}
