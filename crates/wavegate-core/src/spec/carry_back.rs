//! The carry-back's table: what a reconciliation puts back into a store that forgot an
//! upstream's state ([`WaveMachine::carry_back`], `wave.lua`'s `carry_back`), one rule a case.

use crate::wave::{WaveSnapshot, WaveState};

/// One case of the carry-back: the store's state (as a snapshot of a machine at `base`), what
/// the reconciling process last saw, and the state and limit that must result.
#[derive(Debug, Clone, Copy)]
pub struct CarryBackCase {
    /// The rule the case pins down.
    pub name: &'static str,
    /// The base limit.
    pub base: u32,
    /// The store's state before: (state, limit, wave).
    pub store: (WaveState, u32, u64),
    /// What the process carries: the state and limit it last saw.
    pub carried: (WaveState, u32),
    /// The state and limit after, and whether it changed.
    pub expect: (WaveState, u32, bool),
}

/// The cases both twins pass.
pub fn carry_back_cases() -> Vec<CarryBackCase> {
    use WaveState::{Cooldown, Degraded, Normal, Probe};
    let case = |name, base, store, carried, expect| CarryBackCase { name, base, store, carried, expect };
    vec![
        case(
            "a stepped-back limit goes back into a forgotten store",
            4,
            (Normal, 4, 1),
            (Degraded, 2),
            (Degraded, 2, true),
        ),
        case("a probe goes back too", 10, (Normal, 10, 1), (Probe, 1), (Probe, 1, true)),
        case("a store that saw a 429 since keeps its own", 4, (Degraded, 3, 2), (Degraded, 2), (Degraded, 3, false)),
        case("a store back at NORMAL in a later wave keeps it", 4, (Normal, 4, 3), (Degraded, 2), (Normal, 4, false)),
        case("NORMAL carried changes nothing", 4, (Normal, 4, 1), (Normal, 4), (Normal, 4, false)),
        case("a cooldown is carried as a 429, not here", 4, (Normal, 4, 1), (Cooldown, 2), (Normal, 4, false)),
        case("a limit at the base is no step back", 4, (Normal, 4, 1), (Degraded, 4), (Normal, 4, false)),
        case("a limit above the base is no step back", 4, (Normal, 4, 1), (Degraded, 9), (Normal, 4, false)),
        case("a limit of 0 is read as 1", 4, (Normal, 4, 1), (Degraded, 0), (Degraded, 1, true)),
    ]
}

impl CarryBackCase {
    /// The store's state before, as a snapshot.
    pub fn store_snapshot(&self) -> WaveSnapshot {
        let (state, limit, wave) = self.store;
        WaveSnapshot::bare(state, limit, wave)
    }
}

#[cfg(test)]
mod tests {
    use std::num::NonZeroU32;

    use super::*;
    use crate::wave::{WaveConfig, WaveMachine};

    #[test]
    fn the_machine_passes_the_carry_back_table() {
        for case in carry_back_cases() {
            let mut machine = WaveMachine::new(WaveConfig::new(NonZeroU32::new(case.base).unwrap()));
            machine.restore(case.store_snapshot());
            let changed = machine.carry_back(case.carried.0, case.carried.1);
            let after = machine.snapshot();
            assert_eq!((after.state, after.limit, changed), case.expect, "{}", case.name);
            if changed {
                assert_eq!(after.threshold, after.limit, "{}: the limit is the threshold", case.name);
            }
        }
    }
}
