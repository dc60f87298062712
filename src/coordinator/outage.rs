//! Redis down: fail open to a fair local share, then reconcile before going back.
//!
//! On an outage (a timeout, a refused or dropped connection, BUSY, LOADING, failed auth) the
//! coordinator switches to **fallback**: each upstream gets a local gate whose limit is this
//! process's fair share, `max(1, limit ÷ live processes last seen)` (or the configured
//! `fallback_limit`), which starts out holding every permit this process already holds, and
//! carries a shared cooldown in force. Waiters go on locally; calls in progress are not
//! disturbed.
//!
//! All of this happens per failure domain (`domains.rs`): the whole store on one server, each
//! upstream on a Cluster, so a lost master switches only the upstreams whose slots it serves.
//!
//! A probe with backoff (never the request path) asks the store: on one server a `PING` and a
//! heartbeat for every upstream at once; on a Cluster, per upstream, a `ZCARD` routed by its
//! key to the master of its slot. Once it answers, the
//! coordinator **reconciles** each upstream in one script call — the permits still in flight
//! here are registered in the shared set with fresh leases, registrations of permits that
//! finished during the outage are dropped — and carries a 429 seen during the outage into the
//! shared wave when the shared state is NORMAL. While it does, waiters wait and releases are
//! deferred; then it switches back to shared mode and replays them.

use std::time::{Duration, Instant};

use actix::{ActorFutureExt, AsyncContext, Context, Handler, WrapFuture};
use futures_util::FutureExt;
use wavegate_core::class_budget::ClassBudgets;
use wavegate_core::{Clock, FallbackStart, LocalGate, WaveSignal, WaveState, duration_ms};
use wavegate_redis::{Reconciled, SharedGate, StoreError};

use super::domains::{self, PROBE_MIN};
use super::{Coordinator, HEARTBEAT_TTL, OutageBook, Release};
use crate::metrics;
use crate::status::Mode;

/// The longest wait between probes.
const PROBE_MAX: Duration = Duration::from_secs(1);
/// How long a process back in shared mode stays within its fallback share: the others' probes
/// find the store within one probe interval, plus their reconciliation.
const REJOIN_GRACE: Duration = Duration::from_millis(1_500);

/// What one upstream's reconciliation sends.
struct Plan {
    upstream: usize,
    gate: SharedGate,
    adopt: Vec<String>,
    drop: Vec<String>,
    lease: Duration,
    /// Requests and tokens used during the outage.
    usage: (u64, u64),
    /// A 429 or a cooldown to carry into the shared wave.
    carry: Option<Carry>,
}

/// A 429 or a cooldown of the outage, to carry into the shared wave.
#[derive(Debug, Clone, Copy)]
struct Carry {
    /// The cooldown still to run, if one runs here.
    retry_after: Option<Duration>,
    /// A 429 seen here: carried unless a shared cooldown runs. Otherwise (a shared cooldown
    /// carried into the fallback) only when the store has forgotten it (NORMAL again).
    always: bool,
}

/// Reconciles one upstream: its permits, its usage, then a 429 or cooldown to carry.
async fn reconcile_one(plan: Plan, carrier: &str) -> Result<Outcome, (usize, StoreError)> {
    let upstream = plan.upstream;
    let reconciled =
        plan.gate.reconcile(&plan.adopt, &plan.drop, plan.lease, plan.usage).await.map_err(|e| (upstream, e))?;
    let carried_429 = match plan.carry {
        Some(Carry { retry_after, always })
            if reconciled.state != WaveState::Cooldown && (always || reconciled.state == WaveState::Normal) =>
        {
            let signal = WaveSignal::RateLimited { retry_after };
            plan.gate.finish_text(carrier, reconciled.wave, signal, 0).await.map_err(|e| (upstream, e))?;
            true
        }
        _ => false,
    };
    Ok(Outcome {
        upstream,
        reconciled,
        adopted: plan.adopt.len(),
        dropped: plan.drop,
        granted: plan.usage.0,
        carried_429,
    })
}

/// What one upstream's reconciliation did.
struct Outcome {
    upstream: usize,
    reconciled: Reconciled,
    adopted: usize,
    /// The registrations it dropped; any other one recorded meanwhile is dropped after it.
    dropped: Vec<String>,
    /// Permits granted during the outage (charged to the shared budgets).
    granted: u64,
    carried_429: bool,
}

impl Coordinator {
    /// Records a change of `domain`'s mode: its upstreams' gauges and the process's.
    fn switch(&mut self, domain: usize, to: Mode) {
        let from = std::mem::replace(&mut self.domains[domain].mode, to);
        self.domains[domain].epoch += 1;
        self.domains[domain].probe_backoff = PROBE_MIN;
        for &upstream in &self.domains[domain].upstreams {
            metrics::upstream_mode(self.slots[upstream].config.name().as_str(), Some(from), to);
        }
        metrics::mode(domains::least_shared(&self.domains));
    }

    /// Switches `domain` from shared mode to local fallback (does nothing in any other mode).
    pub(super) fn enter_fallback(
        &mut self,
        domain: usize,
        command: &'static str,
        error: &StoreError,
        ctx: &mut Context<Self>,
    ) {
        if self.domains[domain].mode != Mode::Shared {
            return;
        }
        self.switch(domain, Mode::Fallback);
        let upstreams = self.domains[domain].upstreams.clone();
        // Throttled across switches too: a right missing from one script only (shared, then
        // rejected, then shared again at each probe) must not log at every switch.
        self.log_rejection(command, error);
        let first = upstreams.first().map(|&u| self.slots[u].config.name().to_string());
        tracing::warn!(
            command,
            %error,
            live_instances = ?self.live_instances,
            upstreams = upstreams.len(),
            first = ?first,
            "shared store unreachable: switching to local fallback"
        );
        let now = Instant::now();
        let now_ms = self.clock.now_ms();
        for &upstream in &upstreams {
            let slot = &mut self.slots[upstream];
            // This process's share, the store's last state carried, the held permits adopted
            // (the rules and their table: wavegate_core::LocalGate::fallback).
            let start = FallbackStart {
                live: self.live_instances,
                last_shared: wavegate_core::LastShared {
                    state: slot.last_shared.state,
                    wave: slot.last_shared.wave,
                    cooldown_left_ms: slot
                        .last_shared
                        .cooldown_until
                        .filter(|until| *until > now)
                        .map(|until| duration_ms(until - now)),
                },
                recent_grants: slot.recent_grants.iter().copied().collect(),
                learned: slot.local.learned(now_ms),
                held: slot.held.drain().collect(),
            };
            let fallback = LocalGate::fallback(&slot.config, start, now_ms);
            let (gate, share) = (fallback.gate, fallback.share);
            slot.held = fallback.held.into_iter().collect();
            slot.class_budgets =
                ClassBudgets::new(slot.config.classes(), slot.config.budgets().share(fallback.processes));
            // Keep what a failed call just recorded (a release or an acquire whose reply was lost).
            let unreleased = std::mem::take(&mut slot.outage.unreleased);
            slot.outage = OutageBook {
                registered: slot.held.keys().cloned().collect(),
                unreleased,
                entry_wave: gate.machine().snapshot().wave,
                ..OutageBook::default()
            };
            slot.local = gate;
            slot.pumping = false;
            slot.wake_pending = false;
            slot.blocked_until = None;
            tracing::warn!(upstream = %slot.config.name(), fallback_limit = share.get(), held = slot.held.len(), "fallback share");
        }
        for &upstream in &upstreams {
            self.pump(upstream, ctx);
        }
        self.schedule_probe(domain, ctx);
    }

    fn schedule_probe(&mut self, domain: usize, ctx: &mut Context<Self>) {
        let after = self.domains[domain].probe_backoff;
        self.domains[domain].probe_backoff = (after * 2).min(PROBE_MAX);
        ctx.run_later(after, move |act, ctx| act.probe(domain, ctx));
    }

    /// Asks the store whether `domain` is back; reconciles it if it is. The whole store (one
    /// server): `PING` and a heartbeat. One upstream of a Cluster: a command routed by its key
    /// to the master of its slot (the heartbeat beats on its own there).
    fn probe(&mut self, domain: usize, ctx: &mut Context<Self>) {
        if self.domains[domain].mode != Mode::Fallback || self.domains[domain].reconciling {
            return;
        }
        let Some(store) = self.store.clone() else { return };
        let call = if self.heartbeat_domain() == Some(domain) {
            let instance = self.ids.instance().to_owned();
            async move {
                store.ping().await?;
                store.heartbeat(&instance, HEARTBEAT_TTL).await.map(Some)
            }
            .boxed_local()
        } else {
            let gates: Vec<SharedGate> =
                self.domains[domain].upstreams.iter().filter_map(|&u| self.slots[u].shared.clone()).collect();
            async move {
                for gate in gates {
                    gate.probe().await?;
                }
                Ok(None)
            }
            .boxed_local()
        };
        ctx.spawn(call.into_actor(self).map(move |result, act, ctx| match result {
            Ok(live) => {
                if let Some(live) = live {
                    act.note_live(live);
                }
                act.reconcile(domain, ctx);
            }
            Err(error) => {
                act.log_rejection("probe", &error);
                act.schedule_probe(domain, ctx);
            }
        }));
    }

    fn reconcile(&mut self, domain: usize, ctx: &mut Context<Self>) {
        self.domains[domain].reconciling = true;
        let now_ms = self.clock.now_ms();
        let upstreams = self.domains[domain].upstreams.clone();
        let plans: Vec<Plan> = upstreams
            .iter()
            .filter_map(|&upstream| {
                let slot = &mut self.slots[upstream];
                let gate = slot.shared.clone()?;
                let (local, _) = slot.local.status(now_ms);
                let cooling = (local.state == WaveState::Cooldown)
                    .then(|| Duration::from_millis(local.cooldown_until_ms.saturating_sub(now_ms)));
                let carry = match slot.outage.rate_limited {
                    // A 429 seen here during the outage.
                    Some(_) if local.state != WaveState::Normal => Some(Carry { retry_after: cooling, always: true }),
                    // A shared cooldown carried into the fallback, still running: the store
                    // must not have forgotten it (an empty restart does).
                    _ => cooling.map(|rest| Carry { retry_after: Some(rest), always: false }),
                };
                Some(Plan {
                    upstream,
                    gate,
                    adopt: slot.held.keys().cloned().collect(),
                    drop: slot.outage.unreleased.iter().filter(|id| !slot.held.contains_key(*id)).cloned().collect(),
                    lease: slot.config.permit_ttl(),
                    usage: (slot.outage.granted, u64::try_from(slot.outage.tokens).unwrap_or(0)),
                    carry,
                })
            })
            .collect();
        // Whatever happens to the call, these may be registered in the store from now on.
        let sent: Vec<(usize, Vec<String>)> = plans.iter().map(|p| (p.upstream, p.adopt.clone())).collect();
        let carrier = format!("{}:reconcile", self.ids.instance());
        let epoch = self.domains[domain].epoch;
        let call = async move {
            // Each upstream on its own: one that the store refuses (a key of the wrong type)
            // does not hold the others back; an outage stops the whole attempt.
            let mut done = Vec::with_capacity(plans.len());
            let mut refused = Vec::new();
            for plan in plans {
                match reconcile_one(plan, &carrier).await {
                    Ok(outcome) => done.push(outcome),
                    Err((_, error)) if error.is_outage() => return (done, refused, Some(error)),
                    Err((upstream, error)) => refused.push((upstream, error)),
                }
            }
            (done, refused, None)
        };
        ctx.spawn(call.into_actor(self).map(move |(done, refused, outage), act, ctx| {
            act.domains[domain].reconciling = false;
            for (upstream, adopt) in sent {
                act.slots[upstream].outage.registered.extend(adopt);
            }
            // The upstreams reconciled keep no books of it: a later attempt must not adopt,
            // charge or cut again for the same outage.
            for outcome in &done {
                let book = &mut act.slots[outcome.upstream].outage;
                for id in &outcome.dropped {
                    book.unreleased.remove(id);
                }
                book.granted = 0;
                book.tokens = 0;
                book.rate_limited = None;
            }
            for (upstream, error) in &refused {
                tracing::error!(
                    upstream = %act.slots[*upstream].config.name(),
                    %error,
                    "the store refused the reconciliation of this upstream; the others go on"
                );
                metrics::redis_error("reconcile", error.label());
            }
            match outage {
                None if act.domains[domain].epoch == epoch => act.back_to_shared(domain, done, ctx),
                None => act.replay_deferred(domain, ctx),
                Some(error) => {
                    tracing::warn!(%error, reconciled = done.len(), "reconciliation failed; staying in fallback");
                    metrics::redis_error("reconcile", error.label());
                    act.replay_deferred(domain, ctx);
                    for &upstream in &upstreams {
                        act.pump(upstream, ctx);
                    }
                    act.schedule_probe(domain, ctx);
                }
            }
        }));
    }

    fn back_to_shared(&mut self, domain: usize, outcomes: Vec<Outcome>, ctx: &mut Context<Self>) {
        self.switch(domain, Mode::Shared);
        let upstreams = self.domains[domain].upstreams.clone();
        let mut leftovers = Vec::new();
        for &upstream in &upstreams {
            let slot = &mut self.slots[upstream];
            if slot.shared.is_none() {
                continue;
            }
            match outcomes.iter().find(|o| o.upstream == upstream) {
                Some(outcome) => {
                    for wave in slot.held.values_mut() {
                        *wave = outcome.reconciled.adopted_wave;
                    }
                    tracing::info!(
                        upstream = %slot.config.name(),
                        adopted = outcome.adopted,
                        dropped = outcome.dropped.len(),
                        carried_429 = outcome.carried_429,
                        granted_during_outage = outcome.granted,
                        shared_in_flight = outcome.reconciled.in_flight,
                        "reconciled with the shared store"
                    );
                    metrics::reconciled(
                        slot.config.name().as_str(),
                        outcome.adopted,
                        outcome.dropped.len(),
                        outcome.granted,
                    );
                }
                // Refused by the store: its permits are registered again by the lease watchdog.
                None => tracing::error!(upstream = %slot.config.name(), "back in shared mode without a reconciliation"),
            }
            // Registrations recorded while the reconciliation ran (a stale reply that came in
            // then) were not in its plan: drop them now, in shared mode.
            let mut late = std::mem::take(&mut slot.outage).unreleased;
            late.retain(|id| !slot.held.contains_key(id));
            leftovers.extend(late.into_iter().map(|id| (upstream, id)));
            let share = slot.local.machine().config().base_limit.get() as usize;
            slot.rejoin_cap = Some((Instant::now() + REJOIN_GRACE, share));
            let learned = slot.local.learned(self.clock.now_ms());
            slot.local =
                LocalGate::with_budgets(slot.config.wave().clone(), slot.config.budgets()).with_learned(learned, 1);
            slot.class_budgets = ClassBudgets::new(slot.config.classes(), slot.config.budgets());
            slot.pumping = false;
            slot.blocked_until = None;
            slot.cooldown_until = None;
        }
        tracing::info!(upstreams = upstreams.len(), "shared store back: shared mode");
        for (upstream, id) in leftovers {
            self.drop_registration(upstream, id, 0, ctx);
        }
        self.replay_deferred(domain, ctx);
        for &upstream in &upstreams {
            self.pump(upstream, ctx);
        }
    }

    /// The store may hold a registration of `id` that nobody here holds (a grant whose reply
    /// came after a change of mode, a script that ran after its reply was given up on): in
    /// fallback it goes on the list of registrations the reconciliation drops; in shared mode
    /// it is released at once (giving back `tokens` reserved with it). A permit held here under
    /// the same id is left alone (the reconciliation adopts it; its release removes it).
    pub(super) fn drop_registration(&mut self, upstream: usize, id: String, tokens: u64, ctx: &mut Context<Self>) {
        if self.mode_of(upstream) == Mode::Shared && !self.reconciling_of(upstream) {
            if !self.slots[upstream].held.contains_key(&id) {
                let token_delta = -i64::try_from(tokens).unwrap_or(i64::MAX);
                let release =
                    Release { id, wave: 0, signal: WaveSignal::Neutral, token_delta, registration_only: true };
                self.release_attempt(upstream, release, 0, ctx);
            }
        } else {
            self.slots[upstream].outage.unreleased.insert(id);
        }
    }

    fn replay_deferred(&mut self, domain: usize, ctx: &mut Context<Self>) {
        for finish in std::mem::take(&mut self.domains[domain].deferred) {
            <Self as Handler<crate::messages::Finish>>::handle(self, finish, ctx);
        }
    }
}
