//! The adaptive recovery's ceiling: held one below for CEILING_HOLD × limit successes, then
//! tested; a hit while testing steps back by one and resumes there.

use std::num::NonZeroU32;

use wavegate_core::{CEILING_HOLD, Recovery, WaveConfig, WaveMachine, WaveState};

fn machine() -> WaveMachine {
    let mut config = WaveConfig::new(NonZeroU32::new(10).expect("non-zero"));
    config.recovery = Recovery::Adaptive;
    WaveMachine::new(config)
}

/// Reports successes with the limit in use until the limit reaches `target`.
fn grow_to(machine: &mut WaveMachine, target: u32) {
    for _ in 0..10_000 {
        let s = machine.snapshot();
        if s.limit >= target && s.state != WaveState::Probe {
            return;
        }
        machine.on_success(s.wave, s.limit);
    }
    panic!("never reached {target}: {:?}", machine.snapshot());
}

#[test]
fn the_ceiling_is_held_then_tested_and_a_hit_there_steps_back_by_one() {
    let mut m = machine();
    m.on_rate_limited(1, 0, None); // a 429 at 10: halve to 5, remember 10
    m.poll(10_000);
    grow_to(&mut m, 9);
    let s = m.snapshot();
    assert_eq!((s.state, s.limit, s.ceiling), (WaveState::Degraded, 9, 10));
    // Held at 9 (one below the ceiling) for CEILING_HOLD × 9 successes.
    for _ in 0..(CEILING_HOLD * 9 - 1) {
        m.on_success(s.wave, 9);
    }
    assert_eq!(m.snapshot().limit, 9);
    m.on_success(s.wave, 9);
    assert_eq!((m.snapshot().state, m.snapshot().limit), (WaveState::Normal, 10), "tested the ceiling");

    // Now a 429 at 10 again, and at 9 while growing by one: back to 8, resumed without PROBE.
    let wave = m.snapshot().wave;
    m.on_rate_limited(wave, 20_000, None);
    m.poll(40_000);
    grow_to(&mut m, 9);
    let s = m.snapshot();
    m.on_rate_limited(s.wave, 50_000, None);
    let cut = m.snapshot();
    assert_eq!((cut.state, cut.limit, cut.ceiling, cut.resume), (WaveState::Cooldown, 8, 9, 8));
    m.poll(60_000);
    assert_eq!((m.snapshot().state, m.snapshot().limit), (WaveState::Degraded, 8));
}

#[test]
fn the_seed_recovery_is_unchanged_by_usage() {
    let mut config = WaveConfig::new(NonZeroU32::new(10).expect("non-zero"));
    config.recovery = Recovery::Seed;
    let mut m = WaveMachine::new(config);
    m.on_rate_limited(1, 0, None);
    m.poll(10_000);
    for _ in 0..3 {
        m.on_success(2, 1);
    }
    // Seed: successes count whatever the usage.
    m.on_success(2, 0);
    m.on_success(2, 0);
    assert_eq!(m.snapshot().limit, 4);
}
