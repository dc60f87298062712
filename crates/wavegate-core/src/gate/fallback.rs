//! The gate that takes over when the shared store goes away: this process's share of the
//! fleet's, carrying what the store last said.
//!
//! One function, [`LocalGate::fallback`], with these rules (each pinned by a case of
//! `wavegate_core::spec::fallback_cases`, the `spec` feature):
//!
//! 1. **the share of the limit**: `max(1, limit ÷ live processes)` (or the configured
//!    `fallback_limit`); with no heartbeat seen yet, as many processes as the limit (each
//!    takes the `fallback_limit`, else 1), so the fleet in fallback never sends more than
//!    the limit;
//! 2. **the budgets' share**: the configured rate budgets, the classes' own shares of them and
//!    the limits learned from the provider are all divided by the same number of processes;
//! 3. **recent grants charged**: this process's grants of the last minute are charged to its
//!    share as they happened, so a switch (or a flapping store) hands out no fresh burst;
//! 4. **a shared cooldown in force goes on**: COOLDOWN for the rest of it, at half the share
//!    (at least 1), the threshold there;
//! 5. **a recovery in progress goes on** (PROBE, DEGRADED): at the share of its limit,
//!    `max(1, limit × share ÷ base)`;
//! 6. **each held permit is adopted**, its wave mapped to the new numbering: the fallback's
//!    own wave in NORMAL, the one before otherwise ([`LocalGate::adopt`]); a permit of a
//!    shared wave older than the last one seen stays older (its 429 is late here too).

use std::num::NonZeroU32;

use crate::clock::duration_ms;
use crate::config::UpstreamConfig;
use crate::learned_limit::LearnedBudgets;
use crate::wave::WaveState;

use super::LocalGate;

/// What a process last saw of the shared store's wave.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LastShared {
    /// The last state and limit seen, if any.
    pub state: Option<(WaveState, u32)>,
    /// The last shared wave seen (0: none yet).
    pub wave: u64,
    /// What is left of a shared cooldown seen in force, in ms (`None` or 0: none runs).
    pub cooldown_left_ms: Option<u64>,
}

/// What [`LocalGate::fallback`] starts from: what the process knows at the switch.
#[derive(Debug, Clone, Default)]
pub struct FallbackStart<K> {
    /// Live processes at the last heartbeat (`None`: no heartbeat has answered yet).
    pub live: Option<u32>,
    /// The shared wave as last seen.
    pub last_shared: LastShared,
    /// This process's grants of the last minute: (when, in the gate's clock ms; tokens
    /// reserved).
    pub recent_grants: Vec<(u64, u64)>,
    /// The limits learned from the provider, undivided (as the provider said them).
    pub learned: LearnedBudgets,
    /// The permits this process holds, each with the shared wave it was granted in.
    pub held: Vec<(K, u64)>,
}

/// The gate a fallback starts with.
#[derive(Debug, Clone)]
pub struct Fallback<K> {
    /// The gate: this process's share, the store's last state carried, the held permits in.
    pub gate: LocalGate,
    /// Its limit: this process's share of the upstream's.
    pub share: NonZeroU32,
    /// How many processes the budgets were divided among.
    pub processes: u32,
    /// Each held permit with its wave in the gate's numbering.
    pub held: Vec<(K, u64)>,
}

impl LocalGate {
    /// The gate that takes over `config`'s upstream when the shared store goes away at
    /// `now_ms`: see the module's rules.
    pub fn fallback<K: AsRef<str>>(config: &UpstreamConfig, start: FallbackStart<K>, now_ms: u64) -> Fallback<K> {
        let base = config.limit().get();
        // Until a heartbeat has told how many processes share the limit, assume the worst:
        // as many as the limit, so each takes one (or the configured fallback limit).
        let (share, processes) = match start.live {
            Some(live) => (config.fallback_share(live), live.max(1)),
            None => (config.fallback_limit().unwrap_or(NonZeroU32::MIN), base),
        };
        let mut wave = config.wave().clone();
        wave.base_limit = share;
        let mut gate = LocalGate::with_budgets(wave, config.budgets().share(processes))
            .with_learned(start.learned, processes)
            .with_classes(config.classes(), config.default_class(), config.class_count_window());
        for (at_ms, tokens) in &start.recent_grants {
            gate.charge(1, *tokens, *at_ms);
        }
        let last = start.last_shared;
        let mut snapshot = gate.machine().snapshot();
        if let Some(left) = last.cooldown_left_ms.filter(|left| *left > 0) {
            snapshot.state = WaveState::Cooldown;
            snapshot.limit = (share.get() / 2).max(1);
            snapshot.threshold = snapshot.limit;
            snapshot.cooldown_until_ms = now_ms.saturating_add(left);
            gate.machine_mut().restore(snapshot);
        } else if let Some((state @ (WaveState::Probe | WaveState::Degraded), limit)) = last.state {
            snapshot.state = state;
            snapshot.limit = (u64::from(limit) * u64::from(share.get()) / u64::from(base)).max(1) as u32;
            gate.machine_mut().restore(snapshot);
        }
        let lease_ms = duration_ms(config.permit_ttl());
        let held = start
            .held
            .into_iter()
            .map(|(id, shared_wave)| {
                let local = gate.adopt(id.as_ref(), now_ms, lease_ms);
                let wave = if shared_wave < last.wave { local.saturating_sub(1) } else { local };
                (id, wave)
            })
            .collect();
        Fallback { gate, share, processes, held }
    }
}
