//! Property tests of the policy's invariants over random sequences of events.

use std::num::NonZeroU32;
use std::time::{Duration, SystemTime};

use proptest::prelude::*;
use wavegate_core::{
    Ask, BreakerConfig, BreakerState, CallResult, CircuitBreaker, Decision, Instance, LocalGate, Outcome, PermitId,
    RateLimitEffect, WaveConfig, WaveSignal, WaveState, parse_retry_after,
};

#[derive(Debug, Clone)]
enum Op {
    Acquire(u8),
    Success(u8),
    RateLimited(u8, Option<u16>),
    Neutral(u8),
    StaleRateLimited(u8),
    Advance(u16),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0u8..24).prop_map(Op::Acquire),
        4 => (0u8..24).prop_map(Op::Success),
        1 => ((0u8..24), proptest::option::of(0u16..90)).prop_map(|(p, r)| Op::RateLimited(p, r)),
        1 => (0u8..24).prop_map(Op::Neutral),
        1 => (0u8..4).prop_map(Op::StaleRateLimited),
        2 => (0u16..20_000).prop_map(Op::Advance),
    ]
}

fn config(base: u32) -> WaveConfig {
    WaveConfig::new(NonZeroU32::new(base).expect("base >= 1"))
}

/// Permit `n` of the one process these properties run.
fn permit(n: u64) -> PermitId {
    PermitId::new(None, &Instance::new("prop").expect("valid"), n, None)
}

fn ask(id: &PermitId) -> [Ask; 1] {
    [Ask { id: id.clone(), tokens: 0, output: 0, waiting: 1 }]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// The limit stays in [1, base], the wave id only grows, nothing new is admitted during
    /// COOLDOWN, and a new permit is only granted below the limit.
    #[test]
    fn wave_invariants_hold(base in 1u32..=16, ops in proptest::collection::vec(op(), 1..300)) {
        let mut gate = LocalGate::new(config(base));
        let instance = Instance::new("prop").expect("valid");
        let lease = 30_000;
        let mut now = 0u64;
        let mut last_wave = 1;
        let mut waves = std::collections::HashMap::new();
        for op in ops {
            match op {
                Op::Acquire(p) => {
                    let id = permit(p.into());
                    let (before, in_flight) = gate.status(now);
                    let already_held = gate.ledger().get(id.as_str()).is_some();
                    let answer = gate.acquire(&instance, &ask(&id), lease, now);
                    if let Decision::Granted { wave, .. } = answer
                        && !already_held
                    {
                        prop_assert!(before.state != WaveState::Cooldown, "admitted during COOLDOWN");
                        prop_assert!((in_flight as u32) < before.limit, "admitted at the limit");
                        waves.insert(id, wave);
                    }
                }
                Op::Success(p) | Op::Neutral(p) | Op::RateLimited(p, _) => {
                    let id = permit(p.into());
                    let Some(wave) = waves.remove(&id) else { continue };
                    let signal = match op {
                        Op::Success(_) => WaveSignal::Success,
                        Op::RateLimited(_, r) => WaveSignal::RateLimited { retry_after: r.map(|s| Duration::from_secs(s.into())) },
                        _ => WaveSignal::Neutral,
                    };
                    gate.finish(&id, wave, signal, 0, now);
                }
                Op::StaleRateLimited(back) => {
                    let current = gate.status(now).0.wave;
                    let stale = current.saturating_sub(u64::from(back) + 1);
                    let report = gate.finish(&permit(999), stale, WaveSignal::RateLimited { retry_after: None }, 0, now);
                    let is_late = matches!(report.rate_limit, Some(RateLimitEffect::Late { .. }));
                    prop_assert!(is_late);
                }
                Op::Advance(ms) => now += u64::from(ms),
            }
            let (s, _) = gate.status(now);
            prop_assert!((1..=base).contains(&s.limit), "limit {} outside [1, {base}]", s.limit);
            prop_assert!(s.wave >= last_wave, "wave went back from {last_wave} to {}", s.wave);
            prop_assert!(s.threshold >= 1 && s.threshold <= base);
            if s.state == WaveState::Normal { prop_assert_eq!(s.limit, base); }
            last_wave = s.wave;
        }
    }

    /// Any number of 429s from one wave, in any order and with any Retry-After, cut once.
    #[test]
    fn one_burst_cuts_once(
        base in 1u32..=64,
        burst in proptest::collection::vec(proptest::option::of(0u64..100_000), 1..64),
        gaps in proptest::collection::vec(0u64..500, 64),
    ) {
        let mut gate = LocalGate::new(config(base));
        let instance = Instance::new("prop").expect("valid");
        let mut now = 0;
        let held: Vec<(PermitId, u64)> = (0..burst.len().min(base as usize))
            .map(|i| {
                let id = permit(i as u64);
                let Decision::Granted { wave, .. } = gate.acquire(&instance, &ask(&id), 60_000, now) else { unreachable!() };
                (id, wave)
            })
            .collect();
        let mut cuts = 0;
        for (i, retry_after) in burst.iter().enumerate() {
            now += gaps[i];
            let (id, wave) = &held[i % held.len()];
            let report = gate.finish(id, *wave, WaveSignal::RateLimited { retry_after: retry_after.map(Duration::from_millis) }, 0, now);
            if matches!(report.rate_limit, Some(RateLimitEffect::Cut { .. })) { cuts += 1; }
        }
        let (s, _) = gate.status(now);
        prop_assert_eq!(cuts, 1);
        prop_assert_eq!(s.wave, 2);
        prop_assert_eq!(s.threshold, (base / 2).max(1));
    }

    /// No string makes the Retry-After parser or the classifier panic.
    #[test]
    fn retry_after_never_panics(value in any::<String>(), secs in any::<u64>(), status in any::<u16>()) {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(secs % 10_000_000_000);
        let _ = parse_retry_after(&value, now);
        let _ = Outcome::from_status(status, Some(&value), now);
    }

    /// Numeric Retry-After values round-trip.
    #[test]
    fn retry_after_seconds_round_trip(secs in any::<u32>(), millis in 0u32..1000) {
        let value = format!("{secs}.{millis:03}");
        let parsed = parse_retry_after(&value, SystemTime::UNIX_EPOCH);
        prop_assert_eq!(parsed, Ok(Duration::from_secs(secs.into()) + Duration::from_millis(millis.into())));
    }

    /// An open breaker admits nothing before its deadline, and 429s never open it.
    #[test]
    fn breaker_respects_open_period(results in proptest::collection::vec((0u8..3, 0u64..2_000), 1..400)) {
        let config = BreakerConfig { minimum_calls: 3, ..BreakerConfig::default() };
        let mut breaker = CircuitBreaker::new(config);
        let mut now = 0;
        let mut failures_seen = false;
        for (kind, gap) in results {
            now += gap;
            let state = breaker.state();
            match breaker.admit(now) {
                Ok(ticket) => {
                    if let BreakerState::Open { until_ms } = state {
                        prop_assert!(now >= until_ms, "admitted while open");
                    }
                    let result = [CallResult::Success, CallResult::Failure, CallResult::Ignored][kind as usize];
                    failures_seen |= result == CallResult::Failure;
                    breaker.record(ticket, result, now);
                }
                Err(open) => prop_assert!(open.retry_at_ms >= now),
            }
            if !failures_seen {
                prop_assert_eq!(breaker.state(), BreakerState::Closed);
            }
        }
    }
}
