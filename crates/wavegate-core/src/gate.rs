//! The in-process twin of the Redis scripts: permits plus the wave machine for one upstream.
//!
//! [`LocalGate`] answers the same four questions as the Lua scripts do in shared mode:
//! acquire a permit by id, finish it with an outcome (release + report), renew leases and read
//! the status. Local mode and the Redis-outage fallback run it; the spec tables in
//! [`spec`](crate::spec) check that it and the scripts agree.
//!
//! ```
//! use std::num::NonZeroU32;
//! use wavegate_core::{Admission, LocalGate, WaveConfig, WaveSignal};
//!
//! let mut gate = LocalGate::new(WaveConfig::new(NonZeroU32::new(1).unwrap()));
//! let first = gate.acquire("a", 0, 30_000);
//! assert!(matches!(first, Admission::Granted { .. }));
//! assert_eq!(gate.acquire("a", 0, 30_000), first); // a resent acquire: still one permit
//! assert!(matches!(gate.acquire("b", 0, 30_000), Admission::Denied { .. }));
//! let Admission::Granted { wave, .. } = first else { unreachable!() };
//! assert!(gate.finish("a", wave, WaveSignal::Success, 10).held);
//! assert!(!gate.finish("a", wave, WaveSignal::Success, 10).held); // idempotent
//! ```

use std::time::Duration;

use crate::ledger::{HeldPermit, PermitLedger};
use crate::wave::{Admission, RateLimitEffect, Transition, WaveConfig, WaveMachine, WaveSnapshot};

/// What a finished call tells the wave machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaveSignal {
    /// The call succeeded: counts towards recovery.
    Success,
    /// The provider answered 429, with its `Retry-After` if it gave a usable one.
    RateLimited {
        /// The provider's requested delay.
        retry_after: Option<Duration>,
    },
    /// Anything else (5xx, timeouts, client errors, cancellation): not a wave matter.
    Neutral,
}

/// What [`LocalGate::finish`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FinishReport {
    /// Whether the permit was still held (false for an unknown or expired id).
    pub held: bool,
    /// The effect of a 429 on the wave, if the signal was one.
    pub rate_limit: Option<RateLimitEffect>,
    /// A state change caused by a success, if any.
    pub transition: Option<Transition>,
}

/// One upstream's permits and wave state, in process.
#[derive(Debug, Clone)]
pub struct LocalGate {
    machine: WaveMachine,
    ledger: PermitLedger,
}

impl LocalGate {
    /// An empty gate in NORMAL.
    pub fn new(config: WaveConfig) -> Self {
        Self { machine: WaveMachine::new(config), ledger: PermitLedger::new() }
    }

    /// Asks for the permit `id` with a lease of `lease_ms`.
    ///
    /// An id already held is granted again in its own wave (its lease extended), so a resent
    /// acquire never creates a second permit.
    pub fn acquire(&mut self, id: &str, now_ms: u64, lease_ms: u64) -> Admission {
        self.ledger.purge_expired(now_ms);
        self.machine.poll(now_ms);
        let expires_ms = now_ms.saturating_add(lease_ms);
        if let Some(held) = self.ledger.get(id) {
            self.ledger.renew(id, expires_ms);
            let s = self.machine.snapshot();
            return Admission::Granted { wave: held.wave, state: s.state, limit: s.limit };
        }
        let in_flight = u32::try_from(self.ledger.len()).unwrap_or(u32::MAX);
        let admission = self.machine.admit(now_ms, in_flight);
        if let Admission::Granted { wave, .. } = admission {
            self.ledger.insert(id, HeldPermit { expires_ms, wave });
        }
        admission
    }

    /// Takes over a permit whose call is already running (e.g. one granted by the shared store
    /// before an outage): it counts against the limit from now on, without an admission
    /// check. Returns the wave it now belongs to.
    pub fn adopt(&mut self, id: &str, now_ms: u64, lease_ms: u64) -> u64 {
        self.ledger.purge_expired(now_ms);
        self.machine.poll(now_ms);
        let wave = self.machine.snapshot().wave;
        self.ledger.insert(id, HeldPermit { expires_ms: now_ms.saturating_add(lease_ms), wave });
        wave
    }

    /// Reports the outcome of permit `id` (issued in `wave`) and releases it.
    ///
    /// The report counts even when the permit's lease already ended (`held` is then false):
    /// a 429 is news about the wave whoever holds the permit.
    pub fn finish(&mut self, id: &str, wave: u64, signal: WaveSignal, now_ms: u64) -> FinishReport {
        self.ledger.purge_expired(now_ms);
        self.machine.poll(now_ms);
        let (rate_limit, transition) = match signal {
            WaveSignal::Success => (None, self.machine.on_success(wave)),
            WaveSignal::RateLimited { retry_after } => {
                (Some(self.machine.on_rate_limited(wave, now_ms, retry_after)), None)
            }
            WaveSignal::Neutral => (None, None),
        };
        let held = self.ledger.remove(id).is_some();
        FinishReport { held, rate_limit, transition }
    }

    /// Extends the leases of the given held permits; returns how many were still held.
    pub fn renew<'a>(&mut self, ids: impl IntoIterator<Item = &'a str>, now_ms: u64, lease_ms: u64) -> usize {
        self.ledger.purge_expired(now_ms);
        let expires_ms = now_ms.saturating_add(lease_ms);
        ids.into_iter().filter(|id| self.ledger.renew(id, expires_ms)).count()
    }

    /// The wave state and the number of permits held now.
    pub fn status(&mut self, now_ms: u64) -> (WaveSnapshot, usize) {
        self.ledger.purge_expired(now_ms);
        self.machine.poll(now_ms);
        (self.machine.snapshot(), self.ledger.len())
    }

    /// The wave machine, e.g. to carry its state across a change of mode.
    pub fn machine(&self) -> &WaveMachine {
        &self.machine
    }

    /// The wave machine, mutable, e.g. to [`restore`](WaveMachine::restore) a snapshot.
    pub fn machine_mut(&mut self) -> &mut WaveMachine {
        &mut self.machine
    }

    /// The held permits.
    pub fn ledger(&self) -> &PermitLedger {
        &self.ledger
    }
}
