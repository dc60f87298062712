//! The shared store as the engine sees it: each script call as a future answering in the
//! engine's types, so the rest of the engine has no `cfg(feature = "redis")`.
//!
//! With the `redis` feature (on by default) these call `wavegate-redis`. Without it, [`Store`],
//! [`SharedGate`] and [`StoreError`] are types with no values: an `Option` of them is always
//! `None` and a `Gate::Shared` can never be made, so every shared-mode path is statically
//! unreachable (the compiler drops it) and a local-only build neither compiles nor links redis.

use std::time::Duration;

use futures_util::future::LocalBoxFuture;
use wavegate_core::{BudgetStatus, LearnedStatus, RateLimitEffect, WaveState};

#[cfg(feature = "redis")]
pub(crate) use wavegate_redis::{SharedGate, Store, StoreError};

#[cfg(not(feature = "redis"))]
pub(crate) use absent::{SharedGate, Store, StoreError};

/// A gate's answer, now (the in-process gate) or later (a script call).
pub(crate) type GateFuture<T> = LocalBoxFuture<'static, Result<T, StoreError>>;

/// An upstream's wave and permits, as a gate answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Snapshot {
    pub(crate) state: WaveState,
    pub(crate) limit: u32,
    pub(crate) wave: u64,
    /// The rest of the cooldown (zero outside COOLDOWN).
    pub(crate) cooldown_remaining: Duration,
    /// Permits held (across the fleet in shared mode).
    pub(crate) in_flight: u32,
}

/// What a release did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Released {
    /// Whether the permit was still held (its lease had not ended).
    pub(crate) held: bool,
    /// What its 429 did, if it reported one.
    pub(crate) rate_limit: Option<RateLimitEffect>,
    /// The state after it.
    pub(crate) after: Snapshot,
}

/// What a reconciliation left in the shared store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Reconciled {
    /// The shared wave now.
    pub(crate) wave: u64,
    /// The wave the adopted permits report against.
    pub(crate) adopted_wave: u64,
    pub(crate) state: WaveState,
    pub(crate) in_flight: u32,
}

/// An upstream's state as the shared store keeps it, for the status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SharedView {
    pub(crate) now: Snapshot,
    pub(crate) budgets: BudgetStatus,
    pub(crate) learned: LearnedStatus,
    /// Per class, in configured order: the fleet's permits in flight and callers waiting.
    pub(crate) classes: Vec<(u32, u32)>,
}

/// Another process claimed an upstream's keys with another configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ConfigConflict {
    /// The upstream's configuration key.
    pub(crate) upstream: String,
    pub(crate) ours: String,
    pub(crate) theirs: String,
}

#[cfg(feature = "redis")]
mod present {
    use std::time::{Duration, Instant};

    use futures_util::FutureExt;
    use wavegate_core::{
        Ask, DayLeft, Decision, LiveChange, LiveSettings, LiveStamp, OutageUsage, PermitId, TokenDelta, UpstreamConfig,
        WaveSignal, WaveState, WindowReport,
    };
    use wavegate_redis::{SharedGate, Store, StoreError};

    use super::{ConfigConflict, GateFuture, Reconciled, Released, SharedView, Snapshot};

    /// The shared gate of one upstream, for this process's `instance`.
    pub(crate) fn shared_gate(store: &Store, config: &UpstreamConfig, instance: &str) -> SharedGate {
        SharedGate::for_upstream(store.clone(), config).for_instance(instance)
    }

    /// One permit for the first of `asks` the fleet-wide choice reaches.
    pub(crate) fn acquire(gate: &SharedGate, asks: Vec<Ask>, lease: Duration) -> GateFuture<Decision> {
        let gate = gate.clone();
        async move { gate.acquire(&asks, lease).await }.boxed_local()
    }

    pub(crate) fn finish(
        gate: &SharedGate,
        id: PermitId,
        wave: u64,
        signal: WaveSignal,
        token_delta: TokenDelta,
        report: Option<(WindowReport, u64)>,
    ) -> GateFuture<Released> {
        let gate = gate.clone();
        async move {
            let finished = gate.finish_reporting(&id, wave, signal, token_delta, report).await?;
            let s = finished.status;
            let after = Snapshot {
                state: s.state,
                limit: s.limit,
                wave: s.wave,
                cooldown_remaining: s.cooldown_remaining,
                in_flight: s.in_flight,
            };
            Ok(Released { held: finished.held, rate_limit: finished.rate_limit, after })
        }
        .boxed_local()
    }

    /// `signal` with its span moved from the engine's clock (reading `now_ms`) to the store's
    /// (Unix time, the clock its scripts read), at the moment it is sent: the time it takes to
    /// reach the store does not move it.
    pub(crate) fn on_store_clock(signal: WaveSignal, now_ms: u64) -> WaveSignal {
        signal.with_span_moved(now_ms, wavegate_redis::store_now_ms())
    }

    pub(crate) fn renew(gate: &SharedGate, ids: Vec<PermitId>, lease: Duration) -> GateFuture<Vec<PermitId>> {
        let gate = gate.clone();
        async move { gate.renew(&ids, lease).await }.boxed_local()
    }

    pub(crate) fn clear_windows(gate: &SharedGate) -> GateFuture<()> {
        let gate = gate.clone();
        async move { gate.clear_windows().await.map(|_| ()) }.boxed_local()
    }

    /// Registers `adopt`, drops `drop`, charges `usage`; carries back the state and limit last
    /// seen (`carried`) into a store that forgot its state.
    pub(crate) fn reconcile(
        gate: &SharedGate,
        (adopt, drop): (Vec<PermitId>, Vec<PermitId>),
        lease: Duration,
        usage: OutageUsage,
        carried: Option<(WaveState, u32)>,
    ) -> GateFuture<Reconciled> {
        let gate = gate.clone();
        async move {
            let text = |ids: &[PermitId]| ids.iter().map(|id| id.as_str().to_owned()).collect::<Vec<_>>();
            let r = gate.reconcile_carrying(&text(&adopt), &text(&drop), lease, usage, carried).await?;
            Ok(Reconciled { wave: r.wave, adopted_wave: r.adopted_wave, state: r.state, in_flight: r.in_flight })
        }
        .boxed_local()
    }

    pub(crate) fn status(gate: &SharedGate) -> GateFuture<SharedView> {
        let gate = gate.clone();
        async move {
            let (s, classes) = gate.status_with_classes().await?;
            let now = Snapshot {
                state: s.state,
                limit: s.limit,
                wave: s.wave,
                cooldown_remaining: s.cooldown_remaining,
                in_flight: s.in_flight,
            };
            Ok(SharedView { now, budgets: s.budgets, learned: s.learned, classes })
        }
        .boxed_local()
    }

    pub(crate) fn probe(gate: &SharedGate) -> GateFuture<()> {
        let gate = gate.clone();
        async move { gate.probe().await }.boxed_local()
    }

    /// Whether `store` is a Redis Cluster (each upstream a failure domain of its own).
    pub(crate) fn is_cluster(store: &Store) -> bool {
        store.config().topology() == "cluster"
    }

    /// What the store last said is left of `gate`'s day budgets, and when.
    pub(crate) fn day_left(gate: &SharedGate) -> Option<(DayLeft, Instant)> {
        gate.day_left()
    }

    /// A fallback begins: replies coming back keep [`day_left`] as it is until
    /// [`release_day_word`] (they do not count the fallback's grants).
    pub(crate) fn hold_day_word(gate: &SharedGate) {
        gate.hold_day_word();
    }

    /// The store heard the fallback's use: replies to requests sent from now on say the day.
    pub(crate) fn release_day_word(gate: &SharedGate) {
        gate.release_day_word();
    }

    /// The channel on which releases anywhere in the fleet wake `gate`'s process.
    pub(crate) fn wake_channel(gate: &SharedGate) -> String {
        gate.wake_channel()
    }

    /// Whether the store rejects wavegate now (credentials, rights, version).
    pub(crate) fn rejected(store: &Store) -> bool {
        store.health().rejected.is_some()
    }

    /// Why `error` is a rejection of wavegate, and what to change, if it is one.
    pub(crate) fn rejection(error: &StoreError) -> Option<(&'static str, &'static str)> {
        error.rejection().map(|reason| (reason.as_str(), reason.advice()))
    }

    /// Records this process's heartbeat, taking part in the choice of the fleet's gauge
    /// reader with turns of `reader_turn` (zero: no part); answers how many processes are
    /// live, and whether this one reads the shared gauges until its next heartbeat.
    pub(crate) fn heartbeat(
        store: &Store,
        instance: String,
        ttl: Duration,
        reader_turn: Duration,
        mode: Option<(String, String)>,
    ) -> GateFuture<(u32, bool)> {
        let store = store.clone();
        async move {
            let mode = mode.as_ref().map(|(now, before)| (now.as_str(), before.as_str()));
            let beat = store.beat(&instance, ttl, reader_turn, mode).await?;
            Ok((beat.live, beat.gauge_reader))
        }
        .boxed_local()
    }

    pub(crate) fn ping(store: &Store) -> GateFuture<()> {
        let store = store.clone();
        async move { store.ping().await }.boxed_local()
    }

    /// Loads the scripts ahead of their first use.
    pub(crate) fn preload(store: &Store) -> GateFuture<()> {
        let store = store.clone();
        async move { store.preload_scripts().await }.boxed_local()
    }

    /// The upstream's live settings, when their epoch and version are not `known`.
    pub(crate) fn live(gate: &SharedGate, known: Option<LiveStamp>) -> GateFuture<Option<LiveSettings>> {
        let gate = gate.clone();
        async move { gate.live(known).await }.boxed_local()
    }

    /// Stores a live change for the fleet; answers its version.
    pub(crate) fn change_live(gate: &SharedGate, change: LiveChange) -> GateFuture<u64> {
        let gate = gate.clone();
        async move { gate.change_live(&change).await }.boxed_local()
    }

    /// Sends the scripts `settings`' live values from now on.
    pub(crate) fn set_live(gate: &SharedGate, settings: &LiveSettings) {
        gate.set_live(settings);
    }

    /// Tells the fleet the upstream's quota is spent for `pause`.
    pub(crate) fn spend_quota(gate: &SharedGate, pause: Duration) -> GateFuture<u64> {
        let gate = gate.clone();
        async move { gate.spend_quota_fleet(pause).await }.boxed_local()
    }

    /// The fleet's channel of live changes (`gate`'s namespace's).
    pub(crate) fn changes_channel(gate: &SharedGate) -> String {
        gate.keys().changes.clone()
    }

    /// Claims the upstream's configuration; answers another process's, if it differs.
    pub(crate) fn claim_config(gate: &SharedGate) -> GateFuture<Option<ConfigConflict>> {
        let gate = gate.clone();
        async move {
            let theirs = gate.claim_config().await?;
            Ok(theirs.map(|theirs| ConfigConflict {
                upstream: gate.keys().config.clone(),
                ours: gate.config_fingerprint(),
                theirs,
            }))
        }
        .boxed_local()
    }
}

#[cfg(feature = "redis")]
pub(crate) use present::*;

#[cfg(not(feature = "redis"))]
mod absent {
    //! No shared store in a build without the `redis` feature: these types have no values,
    //! and the functions over them cannot be called.

    use std::time::{Duration, Instant};

    use wavegate_core::{
        Ask, DayLeft, Decision, LiveChange, LiveSettings, LiveStamp, OutageUsage, PermitId, TokenDelta, UpstreamConfig,
        WaveSignal, WaveState, WindowReport,
    };

    use super::{ConfigConflict, GateFuture, Reconciled, Released, SharedView};

    /// No store.
    #[derive(Debug, Clone)]
    pub(crate) enum Store {}

    /// No shared gate.
    #[derive(Debug, Clone)]
    pub(crate) enum SharedGate {}

    /// No store error is ever made in this build. (A type with a value, unlike the two
    /// above, so that code matching on a result of the store stays the same in both builds.)
    #[derive(Debug, Clone)]
    #[allow(dead_code)] // never made: there is no store
    pub(crate) struct StoreError(());

    impl StoreError {
        pub(crate) fn is_outage(&self) -> bool {
            false
        }

        pub(crate) fn is_state_lost(&self) -> bool {
            false
        }

        pub(crate) fn label(&self) -> &'static str {
            "none"
        }
    }

    impl std::fmt::Display for StoreError {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("no shared store in this build")
        }
    }

    pub(crate) fn shared_gate(store: &Store, _: &UpstreamConfig, _: &str) -> SharedGate {
        match *store {}
    }

    pub(crate) fn acquire(gate: &SharedGate, _: Vec<Ask>, _: Duration) -> GateFuture<Decision> {
        match *gate {}
    }

    pub(crate) fn finish(
        gate: &SharedGate,
        _: PermitId,
        _: u64,
        _: WaveSignal,
        _: TokenDelta,
        _: Option<(WindowReport, u64)>,
    ) -> GateFuture<Released> {
        match *gate {}
    }

    pub(crate) fn on_store_clock(signal: WaveSignal, _: u64) -> WaveSignal {
        signal
    }

    pub(crate) fn renew(gate: &SharedGate, _: Vec<PermitId>, _: Duration) -> GateFuture<Vec<PermitId>> {
        match *gate {}
    }

    pub(crate) fn clear_windows(gate: &SharedGate) -> GateFuture<()> {
        match *gate {}
    }

    pub(crate) fn reconcile(
        gate: &SharedGate,
        _: (Vec<PermitId>, Vec<PermitId>),
        _: Duration,
        _: OutageUsage,
        _: Option<(WaveState, u32)>,
    ) -> GateFuture<Reconciled> {
        match *gate {}
    }

    pub(crate) fn status(gate: &SharedGate) -> GateFuture<SharedView> {
        match *gate {}
    }

    pub(crate) fn probe(gate: &SharedGate) -> GateFuture<()> {
        match *gate {}
    }

    pub(crate) fn day_left(gate: &SharedGate) -> Option<(DayLeft, Instant)> {
        match *gate {}
    }

    pub(crate) fn hold_day_word(gate: &SharedGate) {
        match *gate {}
    }

    pub(crate) fn release_day_word(gate: &SharedGate) {
        match *gate {}
    }

    pub(crate) fn is_cluster(store: &Store) -> bool {
        match *store {}
    }

    pub(crate) fn rejected(store: &Store) -> bool {
        match *store {}
    }

    pub(crate) fn rejection(_: &StoreError) -> Option<(&'static str, &'static str)> {
        None
    }

    pub(crate) fn heartbeat(
        store: &Store,
        _: String,
        _: Duration,
        _: Duration,
        _: Option<(String, String)>,
    ) -> GateFuture<(u32, bool)> {
        match *store {}
    }

    pub(crate) fn ping(store: &Store) -> GateFuture<()> {
        match *store {}
    }

    pub(crate) fn preload(store: &Store) -> GateFuture<()> {
        match *store {}
    }

    pub(crate) fn claim_config(gate: &SharedGate) -> GateFuture<Option<ConfigConflict>> {
        match *gate {}
    }

    pub(crate) fn live(gate: &SharedGate, _: Option<LiveStamp>) -> GateFuture<Option<LiveSettings>> {
        match *gate {}
    }

    pub(crate) fn change_live(gate: &SharedGate, _: LiveChange) -> GateFuture<u64> {
        match *gate {}
    }

    pub(crate) fn set_live(gate: &SharedGate, _: &LiveSettings) {
        match *gate {}
    }

    pub(crate) fn spend_quota(gate: &SharedGate, _: Duration) -> GateFuture<u64> {
        match *gate {}
    }
}

#[cfg(not(feature = "redis"))]
pub(crate) use absent::{
    acquire, change_live, claim_config, clear_windows, day_left, finish, heartbeat, hold_day_word, is_cluster, live,
    on_store_clock, ping, preload, probe, reconcile, rejected, rejection, release_day_word, renew, set_live,
    shared_gate, spend_quota, status,
};
