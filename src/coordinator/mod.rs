//! The coordinator actor: owns the shared store connection and every upstream's permits.
//!
//! * **Acquire loop** (`acquire_loop.rs`): one per upstream, serving this process's waiters
//!   in FIFO order; only the head is asked for, so Redis load grows with processes, not with
//!   waiting callers. A release wakes it (its own at once, another process's through pub/sub).
//! * **Lease watchdog**: renews this process's permits every third of their lease, in one
//!   call per upstream.
//! * **Modes** (`outage.rs`): shared → local fallback on a store outage (timeout, refused or
//!   dropped connection, BUSY, LOADING, auth) → reconcile → shared. No caller code changes;
//!   calls in progress are not failed by a switch. Each failure domain (`domains.rs`: the
//!   whole store on one server, each upstream on a Cluster) switches on its own.

// Without the `redis` feature the shared store's types have no values (`crate::store`): the
// shared-mode and fallback paths below are unreachable, so what only they use is unused.
#![cfg_attr(not(feature = "redis"), allow(dead_code, unused_imports, unused_mut, unused_variables))]

mod acquire_loop;
#[cfg(feature = "redis")]
mod config_claims;
mod domains;
mod headroom;
#[cfg(feature = "redis")]
mod outage;
#[cfg(feature = "redis")]
mod pubsub;
mod rejection;
mod waiters;

use std::collections::{HashMap, HashSet, VecDeque};
use std::time::{Duration, Instant};

#[cfg(feature = "redis")]
use crate::store::StoreError;
use crate::store::{SharedGate, Store};
use actix::{Actor, ActorFutureExt, AsyncContext, Context, Handler, MessageResult, SpawnHandle, WrapFuture};
use wavegate_core::class_budget::ClassBudgets;
use wavegate_core::priority::ClassTurns;
use wavegate_core::{
    Budgets, Clock, LearnedBudgets, LearnedStatus, LocalGate, MonotonicClock, RateLimitEffect, UpstreamConfig,
    WaveSignal, WaveState, WindowReport, duration_ms,
};

use crate::error::Error;
use crate::ids::PermitIds;
use crate::messages::{Acquire, Drain, DrainReply, Finish, ReadMode, ReadStatus, Wake};
use crate::metrics;
use crate::status::{ClassStatus, Mode, UpstreamStatus};
use domains::Domain;
pub(crate) use headroom::ReadHeadroom;
use waiters::{Waiter, Waiters};

/// How often a process proves it is alive (and learns how many others are).
const HEARTBEAT_EVERY: Duration = Duration::from_secs(1);
/// How often the budget gauges are refreshed.
const BUDGET_GAUGES_EVERY: Duration = Duration::from_secs(1);
/// How long a process counts as live after its last heartbeat: much longer than the beat, so
/// a process cut off from the store for a while (a partial outage, a long pause) is still
/// counted by the others when they compute their fallback shares. A process that is gone for
/// good makes the others' shares smaller (the safe side) for this long.
const HEARTBEAT_TTL: Duration = Duration::from_secs(30);

/// The longest a drain (the last handle's drop) waits for releases on their way to the store.
pub(crate) const DRAIN_BOUND: Duration = Duration::from_secs(1);

/// How long to wait before each new attempt at a release that failed for a reason other than
/// an outage (after the last, the permit's lease ends it).
const FINISH_RETRIES: [Duration; 3] =
    [Duration::from_millis(100), Duration::from_millis(400), Duration::from_millis(1_600)];

/// A release to send (or send again).
#[derive(Debug)]
pub(super) struct Release {
    id: String,
    wave: u64,
    signal: WaveSignal,
    token_delta: i64,
    /// Only a registration that may exist (no call ran under it here): finding nothing to
    /// release is then no news.
    registration_only: bool,
}

/// How far back this process's own grants are remembered for its next fallback's budgets (the
/// budgets are per minute), and at most how many.
const RECENT_GRANTS: (Duration, usize) = (Duration::from_secs(60), 4_096);

/// What this process knows of an upstream's shared state, from the last script replies.
#[derive(Debug, Clone, Copy, Default)]
struct LastShared {
    /// When a shared cooldown ends, if one was seen.
    cooldown_until: Option<Instant>,
    /// The last state and limit seen, if any.
    state: Option<(WaveState, u32)>,
    /// The last shared wave seen (0: none yet).
    wave: u64,
}

/// Book-keeping of one upstream during a fallback, for the reconciliation.
#[derive(Debug, Default)]
struct OutageBook {
    /// Permits held when the outage began: they are registered in the shared store.
    registered: HashSet<String>,
    /// Registrations to drop when the store is back: permits of `registered` that finished
    /// during the outage, releases that failed, grants whose reply came too late. (Any of
    /// them still held by then is adopted instead.)
    unreleased: HashSet<String>,
    /// The fallback gate's wave when the outage began: the local number of the shared wave
    /// then in force.
    entry_wave: u64,
    /// A 429 cut the local wave during the outage, with the cooldown it asked for.
    rate_limited: Option<Option<Duration>>,
    /// Permits granted locally during the outage (usage to hand to the shared budgets).
    granted: u64,
    /// Tokens used during the outage: reservations plus settlements.
    tokens: i64,
}

/// One upstream, as the coordinator keeps it.
#[derive(Debug)]
struct Slot {
    config: UpstreamConfig,
    /// Its failure domain (an index into the coordinator's domains).
    domain: usize,
    /// The in-process gate: the only one in local mode, the fallback's in fallback.
    local: LocalGate,
    shared: Option<SharedGate>,
    waiters: Waiters,
    /// Permits this process holds: id → wave, in the numbering of the gate in charge.
    held: HashMap<String, u64>,
    /// An acquire script call is in flight.
    pumping: bool,
    /// A wake arrived while a call was in flight: ask again as soon as it returns.
    wake_pending: bool,
    retry_timer: Option<SpawnHandle>,
    /// The gate said no one can be admitted before this (a cooldown or a rate budget): a
    /// release or a wake before then would only be refused again.
    blocked_until: Option<Instant>,
    cooldown_until: Option<Instant>,
    last_shared: LastShared,
    outage: OutageBook,
    /// Just back in shared mode: until then, hold at most this many permits (the fallback's
    /// share), while the other processes may still be in their fallback.
    rejoin_cap: Option<(Instant, usize)>,
    /// The weighted turns of the priority classes for this process's own choice (local mode,
    /// fallback); in shared mode the store keeps the fleet's.
    turns: ClassTurns,
    /// The budgets of the classes with a budget share, for this process's own gate (local
    /// mode: the upstream's share; fallback: this process's part of it).
    class_budgets: ClassBudgets,
    /// This process's grants (when, tokens reserved) over the last minute, in any mode, when
    /// the upstream has rate budgets (configured or learned): a fallback gate starts with them charged, so each switch
    /// does not hand out a fresh burst.
    recent_grants: VecDeque<(u64, u64)>,
    /// Whether the learned-limit gauges were last set to a limit (so a forgotten one is
    /// recorded as 0 once).
    learned_recorded: bool,
}

/// The coordinator actor.
#[derive(Debug)]
pub(crate) struct Coordinator {
    slots: Vec<Slot>,
    clock: MonotonicClock,
    ids: PermitIds,
    store: Option<Store>,
    /// The failure domains: each has its mode (see `domains.rs`).
    domains: Vec<Domain>,
    /// Live processes at the last heartbeat; unknown until one succeeds. Never below the
    /// highest count seen within a heartbeat's lifetime (see [`Coordinator::note_live`]).
    live_instances: Option<u32>,
    /// The highest live count seen, and when: it stands for [`HEARTBEAT_TTL`].
    live_peak: Option<(u32, Instant)>,
    /// Releases sent to the store whose reply has not come back.
    releases_in_flight: usize,
    /// Drains waiting for those replies.
    drains: Vec<DrainReply>,
    /// When a rejection of the store was last logged.
    rejection_logged: Option<Instant>,
    /// When a failed heartbeat that switches no mode (a Cluster's) was last logged.
    heartbeat_logged: Option<Instant>,
}

impl Coordinator {
    pub(crate) fn new(upstreams: Vec<UpstreamConfig>, store: Option<Store>) -> Self {
        let ids = PermitIds::new();
        let mode = if store.is_some() { Mode::Shared } else { Mode::Local };
        let (domains, domain_of) = domains::split(upstreams.len(), is_cluster(store.as_ref()), mode);
        let slots = upstreams
            .into_iter()
            .zip(domain_of)
            .map(|(config, domain)| Slot {
                domain,
                local: LocalGate::with_budgets(config.wave().clone(), config.budgets()),
                shared: store.as_ref().map(|store| crate::store::shared_gate(store, &config, ids.instance())),
                waiters: Waiters::new(config.classes().len()),
                turns: ClassTurns::new(config.classes().len()),
                class_budgets: ClassBudgets::new(config.classes(), config.budgets()),
                config,
                held: HashMap::new(),
                pumping: false,
                wake_pending: false,
                retry_timer: None,
                blocked_until: None,
                cooldown_until: None,
                last_shared: LastShared::default(),
                outage: OutageBook::default(),
                recent_grants: VecDeque::new(),
                learned_recorded: false,
                rejoin_cap: None,
            })
            .collect();
        Self {
            slots,
            clock: MonotonicClock::new(),
            ids,
            store,
            domains,
            live_instances: None,
            live_peak: None,
            releases_in_flight: 0,
            drains: Vec::new(),
            rejection_logged: None,
            heartbeat_logged: None,
        }
    }

    /// The failure domain of `upstream`.
    fn domain_of(&self, upstream: usize) -> &Domain {
        &self.domains[self.slots[upstream].domain]
    }

    /// Where `upstream`'s permits come from now.
    pub(super) fn mode_of(&self, upstream: usize) -> Mode {
        self.domain_of(upstream).mode
    }

    /// The epoch of `upstream`'s domain: a reply to a call made under another one is stale.
    pub(super) fn epoch_of(&self, upstream: usize) -> u64 {
        self.domain_of(upstream).epoch
    }

    /// `upstream`'s domain is reconciling: its waiters wait, its finishes are deferred.
    pub(super) fn reconciling_of(&self, upstream: usize) -> bool {
        self.domain_of(upstream).reconciling
    }

    /// The domain whose mode the heartbeat's failures switch: the whole store on one server.
    /// On a Cluster none: the instances key lives on one master, whose loss must not put the
    /// upstreams of the others in fallback (see [`Coordinator::heartbeat`]).
    fn heartbeat_domain(&self) -> Option<usize> {
        (!is_cluster(self.store.as_ref())).then_some(0)
    }

    /// The shared gate of `upstream`, when permits come from the shared store now.
    fn shared_gate(&self, upstream: usize) -> Option<SharedGate> {
        match self.mode_of(upstream) {
            Mode::Shared => self.slots[upstream].shared.clone(),
            _ => None,
        }
    }

    /// Releases a permit and reports its outcome; serves the queue again once it is done.
    fn release(
        &mut self,
        upstream: usize,
        id: String,
        wave: u64,
        signal: WaveSignal,
        token_delta: i64,
        ctx: &mut Context<Self>,
    ) {
        self.release_attempt(upstream, Release { id, wave, signal, token_delta, registration_only: false }, 0, ctx);
    }

    /// One attempt at a release: a store error that is not an outage is tried again a few
    /// times, then left to the lease.
    pub(super) fn release_attempt(&mut self, upstream: usize, release: Release, attempt: u32, ctx: &mut Context<Self>) {
        let Release { id, wave, signal, token_delta, registration_only } = release;
        match self.shared_gate(upstream) {
            #[cfg(feature = "redis")]
            Some(gate) => {
                let epoch = self.epoch_of(upstream);
                let call_id = id.clone();
                let call = async move { gate.finish(&call_id, wave, signal, token_delta).await };
                self.releases_in_flight += 1;
                ctx.spawn(call.into_actor(self).map(move |result, act, ctx| {
                    act.release_done();
                    act.on_released(
                        upstream,
                        Release { id, wave, signal, token_delta, registration_only },
                        attempt,
                        epoch,
                        result,
                        ctx,
                    )
                }));
            }
            None => self.release_local(upstream, id, wave, signal, token_delta),
        }
    }

    /// One release fewer on its way to the store: a drain waiting for none is answered.
    fn release_done(&mut self) {
        self.releases_in_flight = self.releases_in_flight.saturating_sub(1);
        if self.releases_in_flight == 0 {
            for drain in self.drains.drain(..) {
                drain.send();
            }
        }
    }

    /// What a release's reply (or its failure) does.
    #[cfg(feature = "redis")]
    fn on_released(
        &mut self,
        upstream: usize,
        release: Release,
        attempt: u32,
        epoch: u64,
        result: Result<wavegate_redis::Finished, StoreError>,
        ctx: &mut Context<Self>,
    ) {
        let Release { id, wave, signal, token_delta, registration_only } = release;
        let act = self;
        match result {
            Ok(finished) => {
                let slot = &mut act.slots[upstream];
                // Every reply says whether a shared cooldown runs, whoever started it
                // (a late 429's reply too): a fallback must carry it on.
                if finished.status.state == WaveState::Cooldown {
                    slot.last_shared.cooldown_until = Some(Instant::now() + finished.status.cooldown_remaining);
                }
                slot.last_shared.state = Some((finished.status.state, finished.status.limit));
                slot.last_shared.wave = finished.status.wave;
                if !finished.held && !registration_only {
                    // Its lease ended while the call ran: for a while the fleet could
                    // admit one more than the limit.
                    tracing::warn!(upstream = %slot.config.name(), permit = %id, "permit released after its lease ended");
                    metrics::released_after_lease(slot.config.name().as_str());
                }
                let name = slot.config.name().as_str();
                record_rate_limit(name, finished.rate_limit);
                let status = finished.status;
                metrics::wave(name, status.state, status.limit, status.wave);
                metrics::permits_in_flight(name, "fleet", status.in_flight as usize);
                act.pump(upstream, ctx);
            }
            Err(error) if !error.is_outage() => {
                metrics::redis_error("finish", error.label());
                let name = act.slots[upstream].config.name().to_string();
                if attempt < FINISH_RETRIES.len() as u32 {
                    tracing::warn!(upstream = %name, permit = %id, %error, attempt, "release failed; trying again");
                    let again = Release { id, wave, signal, token_delta, registration_only };
                    ctx.run_later(FINISH_RETRIES[attempt as usize], move |act, ctx| {
                        if act.mode_of(upstream) == Mode::Shared {
                            act.release_attempt(upstream, again, attempt + 1, ctx);
                        } else {
                            // The store went away meanwhile: the reconciliation drops it.
                            act.slots[upstream].outage.unreleased.insert(again.id);
                        }
                    });
                } else {
                    tracing::error!(upstream = %name, permit = %id, %error, "release failed; its lease will end it");
                }
            }
            Err(error) => {
                // The release may not have happened: drop the registration when the
                // store is back.
                act.slots[upstream].outage.unreleased.insert(id.clone());
                act.on_store_error(epoch, Some(upstream), "finish", &error, ctx);
                if act.mode_of(upstream) == Mode::Fallback && matches!(signal, WaveSignal::RateLimited { .. }) {
                    // The 429 that could not be reported still cools this process down,
                    // once per shared wave: the permit's wave is the shared one; in the
                    // fallback's numbering the shared wave at the switch is its first.
                    // A 429 of an older shared wave is late and cuts nothing.
                    let now_ms = act.clock.now_ms();
                    let slot = &mut act.slots[upstream];
                    if wave >= slot.last_shared.wave {
                        let local_wave = slot.outage.entry_wave;
                        let report = slot.local.finish(&id, local_wave, signal, now_ms);
                        if let (Some(RateLimitEffect::Cut { .. }), WaveSignal::RateLimited { retry_after }) =
                            (report.rate_limit, signal)
                        {
                            slot.outage.rate_limited = Some(retry_after);
                        }
                    }
                }
            }
        }
    }

    /// A release in local mode or in a fallback: the process's own gate.
    fn release_local(&mut self, upstream: usize, id: String, wave: u64, signal: WaveSignal, token_delta: i64) {
        let now_ms = self.clock.now_ms();
        let mode = self.mode_of(upstream);
        let slot = &mut self.slots[upstream];
        slot.local.settle_tokens(token_delta, now_ms);
        if token_delta != 0 {
            let class = id.split_once('|').and_then(|(name, _)| slot.config.class_index(name));
            slot.class_budgets.settle(class.unwrap_or(slot.config.default_class()), token_delta, now_ms);
        }
        let report = slot.local.finish(&id, wave, signal, now_ms);
        let name = slot.config.name().as_str();
        if !report.held && mode == Mode::Local {
            metrics::released_after_lease(name);
        }
        record_rate_limit(name, report.rate_limit);
        // `finish` has just purged the expired leases and applied time.
        let snapshot = slot.local.machine().snapshot();
        metrics::wave(name, snapshot.state, snapshot.limit, snapshot.wave);
        if mode == Mode::Local {
            metrics::permits_in_flight(name, "fleet", slot.local.ledger().len());
        }
        if mode == Mode::Fallback {
            slot.outage.tokens += token_delta;
            if let Some(RateLimitEffect::Cut { .. }) = report.rate_limit {
                let WaveSignal::RateLimited { retry_after } = signal else { unreachable!("only a 429 cuts") };
                slot.outage.rate_limited = Some(retry_after);
            }
            if slot.outage.registered.remove(&id) {
                slot.outage.unreleased.insert(id);
            }
        }
    }

    /// Hands what a response said is left of the provider's windows to the gate in charge;
    /// the local gate keeps it too, so a fallback starts knowing it.
    fn report_window(&mut self, upstream: usize, id: &str, report: WindowReport, tokens: u64, ctx: &mut Context<Self>) {
        let now_ms = self.clock.now_ms();
        let slot = &mut self.slots[upstream];
        slot.local.report_window(id, report, now_ms, tokens);
        metrics::provider_window_report(slot.config.name().as_str());
        let Some(gate) = self.shared_gate(upstream) else { return };
        #[cfg(not(feature = "redis"))]
        match gate {}
        #[cfg(feature = "redis")]
        {
            let id = id.to_string();
            let call = async move { gate.report_window(&id, report, tokens).await };
            ctx.spawn(call.into_actor(self).map(move |result, act, _| {
                if let Err(error) = result {
                    // The release behind it meets the same error and handles the outage; the
                    // report is only lost (the provider will say it again).
                    metrics::redis_error("report_window", error.label());
                    tracing::debug!(upstream = %act.slots[upstream].config.name(), %error, "provider window report failed");
                }
            }));
        }
    }

    /// The lease watchdog: renews every permit this process holds for `upstream`.
    fn renew(&mut self, upstream: usize, ctx: &mut Context<Self>) {
        let slot = &self.slots[upstream];
        if slot.held.is_empty() {
            return;
        }
        let ids: Vec<String> = slot.held.keys().cloned().collect();
        let lease = slot.config.permit_ttl();
        match self.shared_gate(upstream) {
            #[cfg(feature = "redis")]
            Some(gate) => {
                let epoch = self.epoch_of(upstream);
                let sent = ids.clone();
                let call = async move { gate.renew(&ids, lease).await };
                ctx.spawn(call.into_actor(self).map(move |result, act, ctx| match result {
                    Ok(again) => {
                        // Registered again because the store no longer listed them: either it
                        // lost them while their calls run, or their release reached it first
                        // (a NOSCRIPT reload resends the renewal behind it). The latter must
                        // not hold a slot for a lease.
                        let (running, ended): (Vec<String>, Vec<String>) =
                            again.into_iter().partition(|id| act.slots[upstream].held.contains_key(id));
                        if !running.is_empty() {
                            tracing::warn!(
                                upstream = %act.slots[upstream].config.name(),
                                again = running.len(),
                                "the store had lost permits whose calls still run; registered them again"
                            );
                        }
                        for id in ended {
                            act.drop_registration(upstream, id, 0, ctx);
                        }
                    }
                    Err(error) => {
                        // The renewal may still run (a hung server resumes): any permit of it
                        // that has ended by then would be registered again.
                        let outage = error.is_outage();
                        act.on_store_error(epoch, Some(upstream), "renew", &error, ctx);
                        if outage {
                            let held = &act.slots[upstream].held;
                            let ended: Vec<String> = sent.into_iter().filter(|id| !held.contains_key(id)).collect();
                            for id in ended {
                                act.drop_registration(upstream, id, 0, ctx);
                            }
                        }
                    }
                }));
            }
            None => {
                let now_ms = self.clock.now_ms();
                self.slots[upstream].local.renew(ids.iter().map(String::as_str), now_ms, duration_ms(lease));
            }
        }
    }

    /// Records what is left of each upstream's rate budgets and the limits learned (read from
    /// the store in shared mode: one status call per upstream with budgets, configured or
    /// learned).
    fn record_budgets(&mut self, ctx: &mut Context<Self>) {
        let now_ms = self.clock.now_ms();
        for upstream in 0..self.slots.len() {
            let slot = &self.slots[upstream];
            let learned = slot.local.learned(now_ms);
            if slot.config.budgets() == Budgets::default() && learned == LearnedBudgets::default() {
                if slot.learned_recorded {
                    // Forgotten: the gauges say so once.
                    metrics::learned(slot.config.name().as_str(), LearnedStatus::default());
                    self.slots[upstream].learned_recorded = false;
                }
                continue;
            }
            self.slots[upstream].learned_recorded = learned != LearnedBudgets::default();
            let slot = &self.slots[upstream];
            match self.shared_gate(upstream) {
                #[cfg(feature = "redis")]
                Some(gate) => {
                    let call = async move { gate.status().await };
                    ctx.spawn(call.into_actor(self).map(move |result, act, _| {
                        if let Ok(status) = result {
                            let name = act.slots[upstream].config.name().as_str();
                            metrics::budgets(name, status.budgets);
                            metrics::learned(name, status.learned);
                        }
                    }));
                }
                None => {
                    metrics::budgets(slot.config.name().as_str(), slot.local.budget_status(now_ms));
                    metrics::learned(slot.config.name().as_str(), learned.status(now_ms));
                }
            }
        }
    }

    /// Counts this process as live and learns how many are. On one server it runs in shared
    /// mode only (in fallback the probe beats) and its failure is an outage of every upstream.
    /// On a Cluster it runs always, and its failure switches nothing: the instances key lives
    /// on one master, and only the upstreams whose slots that master serves are cut off by its
    /// loss (their own calls find out). Meanwhile the live count stays the last one seen.
    #[cfg(feature = "redis")]
    fn heartbeat(&mut self, ctx: &mut Context<Self>) {
        let Some(store) = self.store.clone() else { return };
        let domain = self.heartbeat_domain();
        if domain.is_some_and(|d| self.domains[d].mode != Mode::Shared) {
            return;
        }
        let epoch = domain.map_or(0, |d| self.domains[d].epoch);
        let instance = self.ids.instance().to_owned();
        let call = async move { store.heartbeat(&instance, HEARTBEAT_TTL).await };
        ctx.spawn(call.into_actor(self).map(move |result, act, ctx| match result {
            Ok(live) => act.note_live(live),
            Err(error) => act.on_store_error(epoch, None, "heartbeat", &error, ctx),
        }));
    }

    /// Logs a heartbeat lost to an outage that switches no mode (a Cluster's instances master
    /// is down), at most once every [`HEARTBEAT_TTL`].
    #[cfg(feature = "redis")]
    fn log_lost_heartbeat(&mut self, error: &StoreError) {
        let now = Instant::now();
        if self.heartbeat_logged.is_some_and(|at| now.duration_since(at) < HEARTBEAT_TTL) {
            return;
        }
        self.heartbeat_logged = Some(now);
        tracing::warn!(
            %error,
            live_instances = ?self.live_instances,
            "heartbeat failed (the master of the instances key is out of reach): the fallback shares keep the \
             last live count seen"
        );
    }

    /// Takes a heartbeat's count of live processes. A process seen live counts for a
    /// heartbeat's lifetime even when the store forgot it (an empty restart wipes the list,
    /// and the others write theirs again only over the next second): the count used for the
    /// fallback's fair share falls only once the higher one is older than [`HEARTBEAT_TTL`].
    fn note_live(&mut self, live: u32) {
        let live = live.max(1);
        let now = Instant::now();
        let counted = match self.live_peak {
            Some((peak, at)) if peak > live && now.duration_since(at) < HEARTBEAT_TTL => peak,
            _ => {
                self.live_peak = Some((live, now));
                live
            }
        };
        self.live_instances = Some(counted);
    }

    /// A store command failed: an outage switches to fallback; anything else is logged and
    /// the loop asks again later.
    #[cfg(feature = "redis")]
    fn on_store_error(
        &mut self,
        epoch: u64,
        upstream: Option<usize>,
        command: &'static str,
        error: &StoreError,
        ctx: &mut Context<Self>,
    ) {
        let domain = match upstream {
            Some(upstream) => Some(self.slots[upstream].domain),
            None => self.heartbeat_domain(),
        };
        if domain.is_some_and(|d| epoch != self.domains[d].epoch) {
            return;
        }
        metrics::redis_error(command, error.label());
        if error.is_outage() {
            match domain {
                Some(domain) => self.enter_fallback(domain, command, error, ctx),
                None => self.log_lost_heartbeat(error),
            }
        } else if let Some(upstream) = upstream {
            tracing::error!(upstream = %self.slots[upstream].config.name(), command, %error, "shared store error");
            self.retry_in(upstream, acquire_loop::jittered(acquire_loop::STORE_ERROR_RETRY), ctx);
        } else {
            tracing::error!(command, %error, "shared store error");
        }
    }

    fn local_status(&mut self, upstream: usize) -> UpstreamStatus {
        let now_ms = self.clock.now_ms();
        let slot = &mut self.slots[upstream];
        let (snapshot, held) = slot.local.status(now_ms);
        let mode = self.reported_mode(Some(upstream));
        let slot = &mut self.slots[upstream];
        UpstreamStatus {
            upstream: slot.config.name().to_string(),
            mode,
            state: snapshot.state,
            limit: snapshot.limit,
            wave: snapshot.wave,
            cooldown_remaining: Duration::from_millis(snapshot.cooldown_until_ms.saturating_sub(now_ms)),
            in_flight_local: slot.held.len(),
            in_flight_fleet: if mode == Mode::Local { u32::try_from(held).ok() } else { None },
            queue_depth: slot.waiters.len(),
            breaker: "closed",
            budgets: slot.local.budget_status(now_ms),
            learned: slot.local.learned(now_ms).status(now_ms),
            quota_exhausted_for: None,
            schedulers_in_process: 0,
            classes: self.class_statuses(upstream),
        }
    }

    /// This process's callers waiting and permits held in each priority class of `upstream`.
    fn class_statuses(&mut self, upstream: usize) -> Vec<ClassStatus> {
        let slot = &mut self.slots[upstream];
        if slot.config.classes().is_empty() {
            return Vec::new();
        }
        let waiting = slot.waiters.lens();
        let mut in_flight = vec![0; waiting.len()];
        for id in slot.held.keys() {
            let class = id.split_once('|').and_then(|(name, _)| slot.config.class_index(name));
            if let Some(count) = in_flight.get_mut(class.unwrap_or(slot.config.default_class())) {
                *count += 1;
            }
        }
        slot.config
            .classes()
            .iter()
            .zip(waiting.into_iter().zip(in_flight))
            .map(|(class, (waiting, in_flight_local))| ClassStatus {
                class: class.name().to_owned(),
                weight: class.weight_value().get(),
                reserve_percent: class.reserve_percent_value(),
                budget_percent: class.budget_percent_value(),
                waiting,
                in_flight_local,
                in_flight_fleet: None,
                waiting_fleet: None,
            })
            .collect()
    }

    /// Records the per-class gauges of `upstream` (upstreams with classes).
    pub(super) fn record_classes(&mut self, upstream: usize) {
        let statuses = self.class_statuses(upstream);
        let name = self.slots[upstream].config.name().as_str();
        for class in statuses {
            metrics::class_load(name, &class.class, class.waiting, class.in_flight_local);
        }
    }
}

impl Actor for Coordinator {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        metrics::mode(domains::least_shared(&self.domains));
        for slot in &self.slots {
            let name = slot.config.name().as_str();
            metrics::upstream_mode(name, None, self.domains[slot.domain].mode);
            metrics::wave(name, WaveState::Normal, slot.config.limit().get(), 1);
            metrics::permits_in_flight(name, "local", 0);
            metrics::queue_depth(name, 0);
        }
        for (upstream, slot) in self.slots.iter().enumerate() {
            if slot.config.renews_leases() {
                let every = slot.config.renew_every();
                ctx.run_interval(every, move |act, ctx| act.renew(upstream, ctx));
            }
        }
        #[cfg(feature = "redis")]
        if let Some(store) = &self.store {
            let channels = self
                .slots
                .iter()
                .enumerate()
                .filter_map(|(i, s)| s.shared.as_ref().map(|g| (g.keys().released.clone(), i)));
            let instance = self.ids.instance().to_owned();
            pubsub::spawn_listener(store.clone(), instance, channels.collect(), ctx.address());
            let store = store.clone();
            ctx.spawn(async move { store.preload_scripts().await }.into_actor(self).map(|result, _, _| {
                if let Err(error) = result {
                    tracing::warn!(%error, "could not preload the scripts; they will load on first use");
                }
            }));
            self.heartbeat(ctx);
            ctx.run_interval(HEARTBEAT_EVERY, |act, ctx| act.heartbeat(ctx));
            ctx.run_interval(config_claims::CONFIG_CLAIM_EVERY, |act, ctx| act.claim_configs(ctx));
        }
        // Every upstream may come to have a budget: a learned limit is one. Those without any
        // cost nothing here.
        ctx.run_interval(BUDGET_GAUGES_EVERY, |act, ctx| act.record_budgets(ctx));
    }
}

impl Handler<Acquire> for Coordinator {
    type Result = ();

    fn handle(&mut self, acquire: Acquire, ctx: &mut Context<Self>) {
        let upstream = acquire.upstream;
        let now = Instant::now();
        if let Some(error) = self.never_fits(upstream, acquire.tokens, acquire.class) {
            // Refused before any wait: it would only block those queued behind it.
            let _ = acquire.reply.send(Err(error));
            return;
        }
        let slot = &mut self.slots[upstream];
        let capacity = slot.config.queue_capacity().get();
        if slot.waiters.len() >= capacity {
            let name = slot.config.name().to_string();
            metrics::overload_refused(&name, "queue_full");
            let _ = acquire.reply.send(Err(Error::queue_full(name, capacity)));
            return;
        }
        let id = self.ids.next_id();
        let slot = &mut self.slots[upstream];
        // With classes a permit id names its class and the tag of its tenant, so the store
        // counts each class's and each tenant's permits (the key itself never leaves the
        // process).
        let id = match (slot.config.classes().get(acquire.class), &acquire.tenant) {
            (Some(class), Some(tenant)) => {
                format!("{}|{id}|{}", class.name(), wavegate_core::tenant::tenant_tag(tenant))
            }
            // The third field, `-` when no tenant is named, also says that the permit's
            // process renews it every second (see `UpstreamConfig::class_count_window`).
            (Some(class), None) => format!("{}|{id}|{}", class.name(), wavegate_core::tenant::NO_TENANT),
            (None, _) => id,
        };
        slot.waiters.push(Waiter {
            id,
            enqueued: now,
            deadline: acquire.deadline,
            reply: acquire.reply,
            tokens: acquire.tokens,
            class: acquire.class,
            tenant: acquire.tenant,
            at_head: None,
            deadline_timer: Some(ctx.run_later(acquire.deadline.saturating_duration_since(now), move |act, _| {
                act.expire(upstream, Instant::now());
            })),
        });
        metrics::queue_depth(slot.config.name().as_str(), slot.waiters.len());
        self.record_classes(upstream);
        self.pump(upstream, ctx);
    }
}

impl Handler<Finish> for Coordinator {
    type Result = ();

    fn handle(&mut self, finish: Finish, ctx: &mut Context<Self>) {
        let upstream = finish.upstream;
        if self.reconciling_of(upstream) {
            // Replayed once the reconciliation decides who is in charge.
            let domain = self.slots[upstream].domain;
            self.domains[domain].deferred.push(finish);
            return;
        }
        // The coordinator's own record of the wave wins: it follows the permit across modes.
        let slot = &mut self.slots[upstream];
        let wave = slot.held.remove(&finish.id).unwrap_or(finish.wave);
        slot.waiters.released(&finish.id);
        metrics::permits_in_flight(slot.config.name().as_str(), "local", slot.held.len());
        if let Some(report) = finish.window {
            // Before the release, so the grants its release makes room for already see it.
            self.report_window(upstream, &finish.id, report, finish.tokens_reserved, ctx);
        }
        self.record_classes(upstream);
        self.release(upstream, finish.id, wave, finish.signal, finish.token_delta, ctx);
        if self.shared_gate(upstream).is_none() {
            self.pump(upstream, ctx);
        }
    }
}

impl Handler<Wake> for Coordinator {
    type Result = ();

    fn handle(&mut self, wake: Wake, ctx: &mut Context<Self>) {
        if wake.upstream < self.slots.len() {
            self.pump(wake.upstream, ctx);
        }
    }
}

impl Handler<ReadStatus> for Coordinator {
    type Result = ();

    fn handle(&mut self, read: ReadStatus, ctx: &mut Context<Self>) {
        let mut status = self.local_status(read.upstream);
        match self.shared_gate(read.upstream) {
            None => {
                let _ = read.reply.send(status);
            }
            #[cfg(feature = "redis")]
            Some(gate) => {
                let call = async move { gate.status_with_classes().await };
                ctx.spawn(call.into_actor(self).map(move |result, _, _| {
                    if let Ok((shared, classes)) = result {
                        for (class, (in_flight, waiting)) in status.classes.iter_mut().zip(classes) {
                            class.in_flight_fleet = Some(in_flight);
                            class.waiting_fleet = Some(waiting);
                        }
                        status.state = shared.state;
                        status.limit = shared.limit;
                        status.wave = shared.wave;
                        status.cooldown_remaining = shared.cooldown_remaining;
                        status.in_flight_fleet = Some(shared.in_flight);
                        status.budgets = shared.budgets;
                        status.learned = shared.learned;
                    }
                    let _ = read.reply.send(status);
                }));
            }
        }
    }
}

impl Handler<Drain> for Coordinator {
    type Result = ();

    fn handle(&mut self, drain: Drain, ctx: &mut Context<Self>) {
        if self.releases_in_flight == 0 && !self.domains.iter().any(|d| d.reconciling) {
            drain.reply.send();
            return;
        }
        // Each release is bounded by the command timeout; a reconciliation replays the
        // releases it deferred once done. Past the bound the caller goes on anyway.
        self.drains.push(drain.reply);
        ctx.run_later(DRAIN_BOUND, |act, _| {
            for drain in act.drains.drain(..) {
                drain.send();
            }
        });
    }
}

impl Handler<ReadMode> for Coordinator {
    type Result = MessageResult<ReadMode>;

    fn handle(&mut self, read: ReadMode, _: &mut Context<Self>) -> Self::Result {
        MessageResult(self.reported_mode(read.upstream))
    }
}

/// Whether `store` is a Redis Cluster (each upstream a failure domain of its own).
fn is_cluster(store: Option<&Store>) -> bool {
    #[cfg(feature = "redis")]
    return store.is_some_and(|store| store.config().topology() == "cluster");
    #[cfg(not(feature = "redis"))]
    return store.is_some_and(|store| match *store {});
}

/// Counts a reported 429 and what it did to the wave.
fn record_rate_limit(upstream: &str, effect: Option<RateLimitEffect>) {
    match effect {
        Some(RateLimitEffect::Cut { .. }) => metrics::rate_limited(upstream, Some(true)),
        Some(RateLimitEffect::Late { .. }) => metrics::rate_limited(upstream, Some(false)),
        None => {}
    }
}
