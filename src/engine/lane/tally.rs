//! What a lane counts between two samples of its history (see `sampler.rs`).

use std::time::Duration;

/// What happened since the last sample, and the fleet's permits as the store last said.
#[derive(Debug, Default)]
pub(super) struct Tally {
    pub(super) granted: u32,
    pub(super) waited_ms: u64,
    pub(super) wait_max_ms: u32,
    pub(super) rate_limited: u32,
    /// The fleet's permits in the last reply of the shared store (kept across samples).
    pub(super) fleet: Option<u32>,
}

impl Tally {
    /// A permit granted after `wait` (in the queue, then for the permit).
    pub(super) fn granted(&mut self, wait: Duration) {
        let ms = u32::try_from(wait.as_millis()).unwrap_or(u32::MAX);
        self.granted = self.granted.saturating_add(1);
        self.waited_ms = self.waited_ms.saturating_add(u64::from(ms));
        self.wait_max_ms = self.wait_max_ms.max(ms);
    }

    /// A 429 reported.
    pub(super) fn rate_limited(&mut self) {
        self.rate_limited = self.rate_limited.saturating_add(1);
    }

    /// The fleet's permits, as a reply of the shared store said.
    pub(super) fn fleet(&mut self, in_flight: u32) {
        self.fleet = Some(in_flight);
    }

    /// The counts so far, starting the next ones at zero (the fleet's permits are kept).
    pub(super) fn take(&mut self) -> Tally {
        let kept = Tally { fleet: self.fleet, ..Tally::default() };
        std::mem::replace(self, kept)
    }
}
