//! What each upstream did over the last minutes, as this process saw it: one [`Sample`] a
//! second and the [`Change`]s of mode and wave state, kept in process (for a live status page,
//! e.g. `wavegate-web`'s `/wavegate`).
//!
//! Each upstream's lane takes its sample on the one-second tick it already runs (no task of
//! its own, none after the scheduler stops) from what the process holds: the counts of the
//! second that ended, the limit and the fleet's permits as the last reply of the gate in charge
//! said. Sampling sends nothing to the shared store. The rings are bounded
//! ([`HISTORY_SAMPLES`], [`HISTORY_CHANGES`]): about 15 KB an upstream.

use std::collections::VecDeque;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use wavegate_core::WaveState;

use crate::status::Mode;

/// How often each upstream takes a sample.
pub const HISTORY_EVERY: Duration = Duration::from_secs(1);
/// How many samples an upstream keeps: five minutes at one a second.
pub const HISTORY_SAMPLES: usize = 300;
/// How many changes of mode or state an upstream keeps.
pub const HISTORY_CHANGES: usize = 64;

/// One second of an upstream, as this process saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct Sample {
    /// When it was taken, in milliseconds since the Unix epoch.
    pub at_ms: u64,
    /// Where permits came from.
    pub mode: Mode,
    /// The wave state (in shared mode, as the last reply of the store said).
    pub state: WaveState,
    /// The limit (in shared mode, as the last reply of the store said).
    pub limit: u32,
    /// Permits this process held.
    pub in_flight_local: u32,
    /// Permits the fleet held: the in-process gate's count in local mode and fallback, the
    /// last release's reply in shared mode (`None` before the first).
    pub in_flight_fleet: Option<u32>,
    /// Callers of this process waiting for a permit.
    pub waiting: u32,
    /// Permits granted over the second before.
    pub granted: u32,
    /// The mean wait (in the queue, then for the permit) of those, in milliseconds.
    pub wait_mean_ms: u32,
    /// The longest wait of those, in milliseconds.
    pub wait_max_ms: u32,
    /// 429s reported over the second before (those that cut the limit and the late ones).
    pub rate_limited: u32,
}

/// A change of mode or wave state, seen at a sample (so within a second of when it happened).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct Change {
    /// The sample that saw it, in milliseconds since the Unix epoch.
    pub at_ms: u64,
    /// The mode from then on.
    pub mode: Mode,
    /// The wave state from then on.
    pub state: WaveState,
}

/// An upstream's recent history (from `Scheduler::history`), oldest first.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct UpstreamHistory {
    /// The upstream's name.
    pub upstream: String,
    /// The last [`HISTORY_SAMPLES`] samples at most, one a second.
    pub samples: Vec<Sample>,
    /// The last [`HISTORY_CHANGES`] changes at most; the first is the mode and state the
    /// upstream started in (or the oldest kept).
    pub changes: Vec<Change>,
}

/// One upstream's rings, written by its lane, read by the handles.
#[derive(Debug, Default)]
pub(crate) struct HistoryRing {
    rings: Mutex<Rings>,
}

#[derive(Debug, Default)]
struct Rings {
    samples: VecDeque<Sample>,
    changes: VecDeque<Change>,
}

impl HistoryRing {
    fn lock(&self) -> MutexGuard<'_, Rings> {
        self.rings.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Keeps `sample` (dropping the oldest beyond the bounds), and a change if its mode or
    /// state differs from the last one kept.
    pub(crate) fn push(&self, sample: Sample) {
        let mut rings = self.lock();
        if rings.samples.len() == HISTORY_SAMPLES {
            rings.samples.pop_front();
        }
        rings.samples.push_back(sample);
        let changed = rings.changes.back().is_none_or(|last| (last.mode, last.state) != (sample.mode, sample.state));
        if changed {
            if rings.changes.len() == HISTORY_CHANGES {
                rings.changes.pop_front();
            }
            rings.changes.push_back(Change { at_ms: sample.at_ms, mode: sample.mode, state: sample.state });
        }
    }

    /// A copy of what is kept.
    pub(crate) fn read(&self, upstream: &str) -> UpstreamHistory {
        let rings = self.lock();
        UpstreamHistory {
            upstream: upstream.to_owned(),
            samples: rings.samples.iter().copied().collect(),
            changes: rings.changes.iter().copied().collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(at_ms: u64, state: WaveState) -> Sample {
        Sample {
            at_ms,
            mode: Mode::Local,
            state,
            limit: 4,
            in_flight_local: 1,
            in_flight_fleet: Some(1),
            waiting: 0,
            granted: 1,
            wait_mean_ms: 0,
            wait_max_ms: 0,
            rate_limited: 0,
        }
    }

    #[test]
    fn the_rings_are_bounded_and_keep_the_newest() {
        let ring = HistoryRing::default();
        for at in 0..(HISTORY_SAMPLES as u64 + 10) {
            ring.push(sample(at, WaveState::Normal));
        }
        let history = ring.read("llm");
        assert_eq!(history.samples.len(), HISTORY_SAMPLES);
        assert_eq!(history.samples.first().map(|s| s.at_ms), Some(10));
        assert_eq!(history.samples.last().map(|s| s.at_ms), Some(HISTORY_SAMPLES as u64 + 9));
        // One state all along: one change, the start.
        assert_eq!(history.changes.len(), 1);
        for at in 0..(HISTORY_CHANGES as u64 * 2) {
            let state = if at % 2 == 0 { WaveState::Cooldown } else { WaveState::Normal };
            ring.push(sample(1_000 + at, state));
        }
        let changes = ring.read("llm").changes;
        assert_eq!(changes.len(), HISTORY_CHANGES);
        assert_eq!(
            changes.last().map(|c| (c.at_ms, c.state)),
            Some((1_000 + HISTORY_CHANGES as u64 * 2 - 1, WaveState::Normal))
        );
    }

    #[test]
    fn an_upstream_keeps_about_15_kb() {
        // What docs/status-page.md and the module docs say.
        let bytes = HISTORY_SAMPLES * std::mem::size_of::<Sample>() + HISTORY_CHANGES * std::mem::size_of::<Change>();
        assert!(bytes <= 16 * 1024, "{bytes} bytes an upstream");
    }

    #[test]
    fn a_change_is_kept_only_when_the_mode_or_state_changes() {
        let ring = HistoryRing::default();
        ring.push(sample(1, WaveState::Normal));
        ring.push(sample(2, WaveState::Normal));
        ring.push(sample(3, WaveState::Cooldown));
        ring.push(sample(4, WaveState::Cooldown));
        ring.push(Sample { mode: Mode::Fallback, ..sample(5, WaveState::Cooldown) });
        let changes: Vec<_> = ring.read("llm").changes.iter().map(|c| (c.at_ms, c.mode, c.state)).collect();
        assert_eq!(
            changes,
            [
                (1, Mode::Local, WaveState::Normal),
                (3, Mode::Local, WaveState::Cooldown),
                (5, Mode::Fallback, WaveState::Cooldown)
            ]
        );
    }
}
