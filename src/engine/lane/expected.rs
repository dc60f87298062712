//! The expected wait the status shows, per class and for the upstream: an **estimate**, never
//! a reason to refuse anyone (refusals need proofs: `deadline.rs`).
//!
//! For a caller joining a queue now: what holds every grant back for a known time (the rest
//! of a cooldown, of a spent provider window, of a budget's wait as the gate last said or as
//! proved for an ask without tokens, of a spent quota), plus the callers waiting ahead of it
//! times the mean interval between this process's recent grants of the class (its last 32
//! within a minute, `pace.rs`). Unknown (`None`) while
//! callers wait and fewer than two grants came within the last minute. It assumes the pace of
//! the last minute goes on and that a newcomer queues behind everyone already waiting (with
//! the earliest deadline first, a caller with a short deadline is served sooner).

use std::time::Duration;

use super::actor::Lane;
use super::pace::expected;
use crate::engine::clock::Instant;

impl Lane {
    /// The expected wait of a caller joining `class`'s queue now (`None` for the upstream as a
    /// whole), with `waiting` callers ahead of it (see the module docs).
    pub(super) fn expected_wait(&self, class: Option<usize>, waiting: usize) -> Option<Duration> {
        let now = Instant::now();
        // What is proved for an ask without tokens (`deadline.rs`) holds everyone back.
        let proven = self.proven_until((0, 0), self.reserved().as_ref()).map(|(until, _)| until);
        let held_back = [self.cooldown_until, self.window_until, self.blocked_until, proven]
            .into_iter()
            .flatten()
            .map(|until| until.saturating_duration_since(now))
            .chain(self.quota.remaining())
            .max()
            .unwrap_or_default();
        expected(held_back, waiting, self.pace.interval(class, now))
    }
}
