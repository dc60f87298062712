//! The lane's gauges, written only when their value changes — a grant and a release would
//! otherwise write a dozen unchanged gauges each — and all of them again once a second
//! ([`forget`](Gauges::forget) before the lane's one-second refresh), so a recorder installed
//! after the scheduler still gets every gauge within a second.

use wavegate_core::WaveState;

use crate::metrics;

/// The last value written to each of a lane's gauges.
#[derive(Debug, Default)]
pub(super) struct Gauges {
    wave: Option<(WaveState, u32, u64)>,
    queue: Option<usize>,
    local: Option<usize>,
    fleet: Option<usize>,
}

impl Gauges {
    /// The wave's state, limit and id.
    pub(super) fn wave(&mut self, upstream: &str, state: WaveState, limit: u32, wave: u64) {
        if self.wave.replace((state, limit, wave)) != Some((state, limit, wave)) {
            metrics::wave(upstream, state, limit, wave);
        }
    }

    /// Callers of this process waiting.
    pub(super) fn queue(&mut self, upstream: &str, depth: usize) {
        if self.queue.replace(depth) != Some(depth) {
            metrics::queue_depth(upstream, depth);
        }
    }

    /// Permits held by this process.
    pub(super) fn local(&mut self, upstream: &str, held: usize) {
        if self.local.replace(held) != Some(held) {
            metrics::permits_in_flight(upstream, "local", held);
        }
    }

    /// Permits held by the fleet, as a gate last said.
    pub(super) fn fleet(&mut self, upstream: &str, held: usize) {
        if self.fleet.replace(held) != Some(held) {
            metrics::permits_in_flight(upstream, "fleet", held);
        }
    }

    /// Forgets what was written: the next value of each gauge is written again.
    pub(super) fn forget(&mut self) {
        *self = Self::default();
    }
}
