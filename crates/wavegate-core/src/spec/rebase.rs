//! The rebase's table: what a new base limit (a live change of the configured limit, or a
//! rolling deploy's) does to the wave's state ([`WaveMachine::rebase`], `wave.lua`'s
//! `rebase`), one rule a case.

use crate::wave::{WaveSnapshot, WaveState};

/// One case of the rebase: the state under the old base, the new base, and what must result.
#[derive(Debug, Clone, Copy)]
pub struct RebaseCase {
    /// The rule the case pins down.
    pub name: &'static str,
    /// The base the state was saved under.
    pub old_base: u32,
    /// The state before: (state, limit, threshold, ceiling, good).
    pub before: (WaveState, u32, u32, u32, u32),
    /// The new base.
    pub new_base: u32,
    /// After: (limit, threshold, ceiling, good).
    pub expect: (u32, u32, u32, u32),
}

/// The cases both twins pass.
pub fn rebase_cases() -> Vec<RebaseCase> {
    use WaveState::{Cooldown, Degraded, Normal, Probe};
    let case = |name, old_base, before, new_base, expect| RebaseCase { name, old_base, before, new_base, expect };
    vec![
        case("NORMAL follows a raised limit", 10, (Normal, 10, 10, 0, 0), 20, (20, 10, 0, 0)),
        case("NORMAL follows a lowered limit", 10, (Normal, 10, 10, 0, 0), 4, (4, 4, 0, 0)),
        case("a limit at the old base follows it up", 10, (Degraded, 10, 5, 0, 0), 16, (16, 5, 0, 0)),
        case("a stepped-back limit stays stepped back", 10, (Degraded, 6, 6, 8, 6), 20, (6, 6, 8, 6)),
        case("a stepped-back limit above a lower base comes down to it", 10, (Degraded, 6, 6, 8, 6), 4, (4, 4, 4, 4)),
        case("a probe stays a probe", 10, (Probe, 1, 5, 0, 0), 3, (1, 3, 0, 0)),
        case("a cooldown keeps its limit under a higher base", 10, (Cooldown, 5, 5, 0, 0), 20, (5, 5, 0, 0)),
        case("the same base changes nothing", 10, (Degraded, 7, 5, 9, 7), 10, (7, 5, 9, 7)),
        case("a base of 1 holds one", 10, (Degraded, 6, 6, 8, 6), 1, (1, 1, 1, 1)),
    ]
}

impl RebaseCase {
    /// The state before, as a snapshot.
    pub fn before_snapshot(&self) -> WaveSnapshot {
        let (state, limit, threshold, ceiling, good) = self.before;
        let mut snapshot = WaveSnapshot::bare(state, limit, 2);
        snapshot.threshold = threshold;
        snapshot.ceiling = ceiling;
        snapshot.good = good;
        snapshot
    }
}

#[cfg(test)]
mod tests {
    use std::num::NonZeroU32;

    use super::*;
    use crate::wave::{WaveConfig, WaveMachine};

    #[test]
    fn the_machine_passes_the_rebase_table() {
        for case in rebase_cases() {
            let mut machine = WaveMachine::new(WaveConfig::new(NonZeroU32::new(case.old_base).unwrap()));
            machine.restore(case.before_snapshot());
            machine.rebase(NonZeroU32::new(case.new_base).unwrap());
            let s = machine.snapshot();
            assert_eq!((s.limit, s.threshold, s.ceiling, s.good), case.expect, "{}", case.name);
            assert_eq!(s.state, case.before.0, "{}: the state stays", case.name);
            assert_eq!(machine.config().base_limit.get(), case.new_base, "{}", case.name);
        }
    }
}
