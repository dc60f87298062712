//! The adaptive recovery against a provider of hidden capacity, on a simulated clock: it
//! learns the capacity without stopping the fleet, its tests are spaced and backed off, and it
//! follows a capacity that moves.

use std::num::NonZeroU32;
use std::time::Duration;

use wavegate_core::{RateLimitEffect, Recovery, WaveConfig, WaveMachine, WaveState};

fn machine(limit: u32) -> WaveMachine {
    let mut config = WaveConfig::new(NonZeroU32::new(limit).unwrap());
    config.recovery = Recovery::Adaptive;
    WaveMachine::new(config)
}

/// What a simulated run saw.
#[derive(Debug, Default)]
struct Run {
    rate_limited: u32,
    stops: u32,
    /// Milliseconds spent with the provider fully used (the limit at or above the capacity).
    at_capacity_ms: u64,
    /// Milliseconds spent in COOLDOWN.
    cooling_ms: u64,
}

/// A fleet that always has work, calls of `call_ms`, a provider that serves `capacity(t)` at
/// once and answers 429 with `retry_after` beyond: `limit` calls start together, those beyond
/// the capacity are refused at once and the rest succeed `call_ms` later.
fn simulate(
    m: &mut WaveMachine,
    run_ms: u64,
    call_ms: u64,
    retry_after: Option<Duration>,
    capacity: impl Fn(u64) -> u32,
) -> Run {
    let mut run = Run::default();
    let mut now = 0;
    while now < run_ms {
        if let wavegate_core::Admission::Denied { retry_after_ms, .. } = m.admit(now, 0) {
            let wait = retry_after_ms.max(1);
            run.cooling_ms += wait;
            now += wait;
            continue;
        }
        let s = m.snapshot();
        let cap = capacity(now);
        let (wave, limit) = (s.wave, s.limit);
        if limit > cap {
            run.rate_limited += 1;
            if let RateLimitEffect::Cut { cooldown, .. } = m.on_rate_limited(wave, now, retry_after)
                && !cooldown.is_zero()
            {
                run.stops += 1;
            }
            // The other calls of the batch were served: they say nothing new (older wave).
            run.at_capacity_ms += call_ms;
            now += call_ms;
            continue;
        }
        if limit == cap {
            run.at_capacity_ms += call_ms;
        }
        for _ in 0..limit {
            m.on_success(wave, limit, now + call_ms);
        }
        now += call_ms;
    }
    run
}

#[test]
fn a_hidden_capacity_is_learned_without_stopping_the_fleet() {
    for retry_after in [Some(Duration::from_secs(1)), None] {
        let mut m = machine(10);
        let run = simulate(&mut m, 120_000, 20, retry_after, |_| 8);
        assert_eq!(run.stops, 0, "{retry_after:?}: {run:?}");
        assert_eq!(run.cooling_ms, 0, "{retry_after:?}: {run:?}");
        // One 429 to learn, then one per test: 1, 2, 4, 8, 8, ... s apart.
        assert!(run.rate_limited <= 1 + 3 + 120 / 8, "{retry_after:?}: {run:?}");
        assert!(run.at_capacity_ms >= 120_000 * 95 / 100, "{retry_after:?}: {run:?}");
        let s = m.snapshot();
        assert_eq!((s.state, s.limit, s.ceiling), (WaveState::Degraded, 8, 9));
        assert_eq!(s.spacing_ms, 8_000, "the spacing backed off to its longest");
    }
}

#[test]
fn long_calls_learn_as_cheaply() {
    let mut m = machine(10);
    let run = simulate(&mut m, 600_000, 2_000, Some(Duration::from_secs(1)), |_| 8);
    assert_eq!(run.stops, 0, "{run:?}");
    assert!(run.at_capacity_ms >= 600_000 * 90 / 100, "{run:?}");
    // Tests are spaced in rounds too: at most one per 32 rounds (64 s of 2 s calls) once
    // backed off, not one per 8 s (which would be 75 in 600 s).
    assert!(run.rate_limited <= 1 + 6 + 600 / 64, "{run:?}");
    assert_eq!(m.snapshot().retest_rounds, 32);
}

#[test]
fn a_capacity_that_moves_is_followed_down_at_once_and_up_within_the_longest_spacing() {
    let mut m = machine(16);
    let capacity = |t: u64| match t {
        0..30_000 => 8,
        30_000..60_000 => 4,
        _ => 12,
    };
    let run = simulate(&mut m, 90_000, 20, Some(Duration::from_secs(1)), capacity);
    // Down: the 429 at a limit that held stops the fleet once.
    assert!(run.stops >= 1 && run.stops <= 2, "{run:?}");
    // Up: at most the longest spacing plus the growth from 4 to 12.
    assert!(run.at_capacity_ms >= 90_000 * 75 / 100, "{run:?}");
    assert_eq!(m.snapshot().limit, 12);
}

#[test]
fn a_stop_resets_what_held_and_the_probe_follows() {
    let mut m = machine(10);
    simulate(&mut m, 10_000, 20, None, |_| 8);
    let s = m.snapshot();
    assert_eq!(s.good, 8);
    let RateLimitEffect::Cut { to, cooldown, .. } = m.on_rate_limited(s.wave, 10_000, None) else { panic!() };
    assert_eq!((to, cooldown), (4, Duration::from_secs(5)), "at what held: half and the first ladder step");
    let s = m.snapshot();
    assert_eq!((s.state, s.good, s.ceiling), (WaveState::Cooldown, 0, 0));
    m.poll(15_000);
    assert_eq!(m.snapshot().state, WaveState::Probe);
}
