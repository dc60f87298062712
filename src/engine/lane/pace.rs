//! This process's recent grants, per class and for the upstream: the pace the status's
//! expected wait is computed from (`expected.rs`).

use std::collections::VecDeque;
use std::time::Duration;

use crate::engine::clock::Instant;

/// How many recent grants the pace is taken from, and how far back.
const RECENT: (usize, Duration) = (32, Duration::from_secs(60));

/// The instants of this process's recent grants, per class and for the upstream.
#[derive(Debug, Default)]
pub(super) struct Pace {
    classes: Vec<VecDeque<Instant>>,
    all: VecDeque<Instant>,
}

impl Pace {
    /// A grant of `class` at `at`.
    pub(super) fn granted(&mut self, class: usize, at: Instant) {
        if self.classes.len() <= class {
            self.classes.resize_with(class + 1, VecDeque::new);
        }
        for grants in [&mut self.classes[class], &mut self.all] {
            if grants.len() >= RECENT.0 {
                grants.pop_front();
            }
            grants.push_back(at);
        }
    }

    /// The mean interval between the recent grants of `class` (`None`: of every class), at
    /// `now`; `None` with fewer than two in the last minute.
    pub(super) fn interval(&self, class: Option<usize>, now: Instant) -> Option<Duration> {
        let grants = match class {
            Some(class) => self.classes.get(class)?,
            None => &self.all,
        };
        let since = now.checked_sub(RECENT.1).unwrap_or(now);
        let recent: Vec<Instant> = grants.iter().copied().filter(|at| *at >= since).collect();
        let (first, last) = (recent.first()?, recent.last()?);
        let spans = u32::try_from(recent.len() - 1).ok().filter(|n| *n > 0)?;
        Some(last.saturating_duration_since(*first) / spans)
    }
}

/// `hold`, plus `waiting` callers served one per `interval`; unknown when callers wait at an
/// unknown pace.
pub(super) fn expected(hold: Duration, waiting: usize, interval: Option<Duration>) -> Option<Duration> {
    if waiting == 0 {
        return Some(hold);
    }
    let waiting = u32::try_from(waiting).unwrap_or(u32::MAX);
    interval.map(|interval| hold.saturating_add(interval.saturating_mul(waiting)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wait_is_the_hold_plus_the_callers_ahead_at_the_recent_pace() {
        let mut pace = Pace::default();
        let start = Instant::now();
        // Class 1 served every 200 ms, class 0 once.
        for n in 0..5 {
            pace.granted(1, start + Duration::from_millis(200 * n));
        }
        pace.granted(0, start + Duration::from_millis(900));
        let now = start + Duration::from_secs(1);
        assert_eq!(pace.interval(Some(1), now), Some(Duration::from_millis(200)));
        assert_eq!(pace.interval(Some(0), now), None, "one grant says no pace");
        assert_eq!(pace.interval(None, now), Some(Duration::from_millis(180)));
        let hold = Duration::from_millis(500);
        assert_eq!(expected(hold, 3, pace.interval(Some(1), now)), Some(Duration::from_millis(1_100)));
        assert_eq!(expected(hold, 0, None), Some(hold), "nobody ahead: the hold alone");
        assert_eq!(expected(hold, 2, None), None, "callers ahead at an unknown pace");
        // A minute later the old grants say nothing any more.
        assert_eq!(pace.interval(Some(1), now + Duration::from_secs(61)), None);
    }
}
