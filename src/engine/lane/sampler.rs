//! The lane's second-by-second history (see `crate::history`): the sample it takes at each
//! tick, from what it counted since the last one (`tally.rs`) and what the process holds
//! (nothing is asked of the shared store).

use std::time::{SystemTime, UNIX_EPOCH};

use wavegate_core::Clock;

use super::actor::Lane;
use super::tally::Tally;
use crate::history::Sample;
use crate::status::Mode;

impl Lane {
    /// Takes the sample of the second that ended, and starts counting the next.
    pub(super) fn record_sample(&mut self) {
        let now_ms = self.clock.now_ms();
        let local = self.local.snapshot(now_ms);
        let mode = self.reported_mode();
        let (state, limit, fleet) = match (self.mode, self.last_shared.state) {
            (Mode::Shared, Some((state, limit))) => (state, limit, self.tally.fleet),
            (Mode::Shared, None) => (local.state, self.config.limit().get(), self.tally.fleet),
            _ => (local.state, local.limit, Some(local.in_flight)),
        };
        let tally: Tally = self.tally.take();
        let at_ms = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |since| since.as_millis() as u64);
        let count = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
        self.history.push(Sample {
            at_ms,
            mode,
            state,
            limit,
            in_flight_local: count(self.held.len()),
            in_flight_fleet: fleet,
            waiting: count(self.waiters.len()),
            granted: tally.granted,
            wait_mean_ms: tally.waited_ms.checked_div(u64::from(tally.granted)).map_or(0, |mean| mean as u32),
            wait_max_ms: tally.wait_max_ms,
            rate_limited: tally.rate_limited,
        });
    }
}
