//! The gate in charge of an upstream's permits: the in-process one or the shared store's.
//!
//! Both answer the same operations with the same types, as an [`Answer`]: now (the in-process
//! gate) or later (a script call), so a lane has one path for acquire, release, renewal and
//! reports, whichever mode it is in.

use std::sync::Arc;
use std::time::Duration;

use wavegate_core::{Ask, Decision, Instance, PermitId, TokenDelta, WaveSignal, WindowReport, duration_ms};

use super::process_gate::ProcessGate;
use super::store::{self, GateFuture, Released, SharedGate, StoreError};

/// What a release settles besides the permit itself.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Settlement {
    /// The call's outcome for the permit's wave.
    pub(crate) signal: WaveSignal,
    /// The tokens used beyond the reservation (negative: a refund).
    pub(crate) token_delta: TokenDelta,
    /// What the call's answer said of the provider's windows, with the tokens the call
    /// reserved: the store takes it in with the release, in one round trip. (The in-process
    /// gate has been told it already: the lane tells it whichever gate is in charge.)
    pub(crate) report: Option<(WindowReport, u64)>,
}

/// A gate's answer: now (the in-process gate), or later (a script call in flight).
pub(crate) enum Answer<T> {
    Now(Result<T, StoreError>),
    Later(GateFuture<T>),
}

impl<T> std::fmt::Debug for Answer<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Answer::Now(_) => "Answer::Now",
            Answer::Later(_) => "Answer::Later",
        })
    }
}

/// Where an upstream's permits come from now.
#[derive(Debug, Clone)]
pub(crate) enum Gate {
    /// This process's own gate (local mode, fallback).
    Local(Arc<ProcessGate>),
    /// The shared store.
    Shared(Arc<SharedGate>),
}

impl Gate {
    /// One permit for the first of `instance`'s `asks` the choice reaches (or a denial naming
    /// the ask it answers); `None` when there is nothing to ask for.
    pub(crate) fn acquire(
        &self,
        instance: &Instance,
        asks: Vec<Ask>,
        lease: Duration,
        now_ms: u64,
    ) -> Option<Answer<Decision>> {
        if asks.is_empty() {
            return None;
        }
        Some(match self {
            Gate::Local(gate) => Answer::Now(Ok(gate.acquire(instance, &asks, duration_ms(lease), now_ms))),
            Gate::Shared(gate) => Answer::Later(store::acquire(gate, asks, lease)),
        })
    }

    /// Releases `id` (held by `instance`) and settles it: its outcome for `wave`, its tokens
    /// and the provider's report its answer carried ([`Settlement`]).
    pub(crate) fn release(
        &self,
        instance: &Instance,
        id: PermitId,
        wave: u64,
        settlement: Settlement,
        now_ms: u64,
    ) -> Answer<Released> {
        let Settlement { signal, token_delta, report } = settlement;
        match self {
            Gate::Local(gate) => Answer::Now(Ok(gate.release(instance, &id, wave, signal, token_delta, now_ms))),
            Gate::Shared(gate) => {
                Answer::Later(store::finish(gate, id, wave, store::on_store_clock(signal, now_ms), token_delta, report))
            }
        }
    }

    /// Extends the leases of `ids`; answers those that had to be registered again.
    pub(crate) fn renew(&self, ids: Vec<PermitId>, lease: Duration, now_ms: u64) -> Answer<Vec<PermitId>> {
        match self {
            Gate::Local(gate) => Answer::Now(Ok(gate.renew(&ids, now_ms, duration_ms(lease)))),
            Gate::Shared(gate) => Answer::Later(store::renew(gate, ids, lease)),
        }
    }

    /// Whether this is the shared store's gate.
    pub(crate) fn is_shared(&self) -> bool {
        matches!(self, Gate::Shared(_))
    }
}
