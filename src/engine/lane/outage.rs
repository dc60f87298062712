//! The lane's side of a Redis outage: fail open to a fair local share, then reconcile before
//! going back. The coordinator decides when (it owns the failure domains and the probe); the
//! lane does what its own permits need.
//!
//! * **Fallback** ([`Switch::Fallback`]): the lane's gate becomes this process's share of the
//!   limit (`ProcessGate::fallback`), which starts out holding every permit the lane holds and
//!   carries a shared cooldown in force. Waiters go on locally; calls in progress are not
//!   disturbed.
//! * **Reconcile** ([`Reconcile`]): the permits still in flight here are registered in the
//!   shared set with fresh leases, registrations of permits that finished during the outage
//!   are dropped, the usage of the outage is charged to the shared budgets, and a 429 seen
//!   during the outage is carried into the shared wave when the shared state is NORMAL. While
//!   it runs, waiters wait and releases are deferred.
//! * **Back** ([`Switch::Shared`]), or not ([`Switch::Abort`]): the deferred releases are
//!   replayed with the gate then in charge.

use std::sync::Arc;
use std::time::Duration;

use actix::{ActorFutureExt, Context, Handler, Message, ResponseActFuture, WrapFuture};
use wavegate_core::{
    ChargeStart, Clock, FallbackStart, LastShared, OutageUsage, PermitId, WaveSignal, WaveState, duration_ms,
};

use super::actor::Lane;
use super::book::OutageBook;
use super::release::Release;
use crate::engine::clock::Instant;
use crate::engine::gate::Gate;
use crate::engine::process_gate::ProcessGate;
use crate::engine::store::{self, StoreError};
use crate::metrics;
use crate::status::Mode;

/// How long a lane back in shared mode stays within its fallback share: the other processes'
/// probes find the store within one probe interval, plus their reconciliation.
const REJOIN_GRACE: Duration = Duration::from_millis(1_500);

/// The coordinator tells a lane which gate is in charge from now on, under `epoch`.
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub(crate) enum Switch {
    /// The store is out of reach: this process's fair share of the limit.
    Fallback {
        epoch: u64,
        /// Processes live at the last heartbeat, if one succeeded.
        live: Option<u32>,
    },
    /// Reconciled: the shared store again.
    Shared { epoch: u64 },
    /// The reconciliation failed: still in fallback.
    Abort,
}

/// Reconcile this lane's permits with the store (its domain's probe found it back).
#[derive(Debug, Message)]
#[rtype(result = "Result<ReconcileReport, StoreError>")]
pub(crate) struct Reconcile;

/// What a lane's reconciliation did, for the coordinator's log.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct ReconcileReport {
    pub(crate) adopted: usize,
    pub(crate) dropped: usize,
    pub(crate) granted: u64,
    pub(crate) carried_429: bool,
    pub(crate) shared_in_flight: u32,
}

/// What a reconciliation sends.
struct Plan {
    adopt: Vec<PermitId>,
    drop: Vec<PermitId>,
    lease: Duration,
    /// Requests and tokens used during the outage, and the latest start they can be charged
    /// to the day budgets from.
    usage: OutageUsage,
    /// A 429 or a cooldown to carry into the shared wave: the cooldown still to run here, and
    /// whether it is carried even when the store's state is not NORMAL (a 429 seen here, unless
    /// a shared cooldown runs) or only when the store forgot it (a shared cooldown carried into
    /// the fallback).
    carry: Option<(Option<Duration>, bool)>,
    /// The shared state and limit last seen: a recovery in progress (a limit a 429 stepped
    /// back) goes back into a store that forgot it (`WaveMachine::carry_back`).
    carry_back: Option<(WaveState, u32)>,
}

impl Handler<Switch> for Lane {
    type Result = ();

    fn handle(&mut self, switch: Switch, ctx: &mut Context<Self>) {
        self.switching = false;
        match switch {
            Switch::Fallback { epoch, live } => self.enter_fallback(epoch, live),
            Switch::Shared { epoch } => {
                self.back_to_shared(epoch);
                if self.mode == Mode::Shared {
                    // The live settings at once, not at the next tick: a change made meanwhile,
                    // or settings the store lost with its state (FLUSHALL: back to the
                    // configured values), reach this process as soon as it is back.
                    self.check_live(ctx, None);
                }
            }
            Switch::Abort => self.reconciling = false,
        }
        self.replay_deferred(ctx);
        self.pump(ctx);
    }
}

impl Handler<Reconcile> for Lane {
    type Result = ResponseActFuture<Self, Result<ReconcileReport, StoreError>>;

    fn handle(&mut self, _: Reconcile, _: &mut Context<Self>) -> Self::Result {
        self.reconciling = true;
        let Some(gate) = self.shared.clone() else {
            return Box::pin(futures_util::future::ready(Ok(ReconcileReport::default())).into_actor(self));
        };
        let plan = self.plan();
        // Whatever happens to the call, these may be registered in the store from now on.
        let sent = plan.adopt.clone();
        let carrier = PermitId::new(None, &self.instance, 0, None);
        let granted = plan.usage.requests;
        let call = async move {
            let ids = (plan.adopt.clone(), plan.drop.clone());
            let reconciled = store::reconcile(&gate, ids, plan.lease, plan.usage, plan.carry_back).await?;
            // The 429 to carry, and whether it made it (the permits and the usage did already).
            let carried = match plan.carry {
                Some((retry_after, always))
                    if reconciled.state != WaveState::Cooldown && (always || reconciled.state == WaveState::Normal) =>
                {
                    let signal = WaveSignal::RateLimited { retry_after };
                    Some(store::finish(&gate, carrier, reconciled.wave, signal, 0.into(), None).await.map(|_| ()))
                }
                _ => None,
            };
            Ok((reconciled, plan.adopt.len(), plan.drop, carried))
        };
        Box::pin(call.into_actor(self).map(move |result, act, _| {
            act.outage.registered.extend(sent);
            let (reconciled, adopted, dropped, carried) = result?;
            // Reconciled: later attempts must not adopt, charge or drop again for this outage
            // (even if carrying its 429 failed: that alone is tried again).
            for id in &dropped {
                act.outage.unreleased.remove(id);
            }
            act.outage.granted = 0;
            act.outage.tokens = 0;
            act.outage.charge_start = ChargeStart::default();
            if let Some(Err(error)) = carried {
                return Err(error);
            }
            act.outage.rate_limited = None;
            act.reconciled = Some(reconciled);
            let report = ReconcileReport {
                adopted,
                dropped: dropped.len(),
                granted,
                carried_429: carried.is_some(),
                shared_in_flight: reconciled.in_flight,
            };
            metrics::reconciled(act.name(), adopted, dropped.len(), granted);
            Ok(report)
        }))
    }
}

impl Lane {
    /// Switches from shared mode to this process's fallback share.
    fn enter_fallback(&mut self, epoch: u64, live: Option<u32>) {
        self.epoch = epoch;
        if self.mode != Mode::Shared {
            return;
        }
        self.set_mode(Mode::Fallback);
        // Replies on their way (run before the store hears of this fallback's grants) must not
        // become the word its use is counted against.
        if let Some(shared) = self.shared.as_deref() {
            store::hold_day_word(shared);
        }
        let now = Instant::now();
        let now_ms = self.clock.now_ms();
        let (_, _, learned) = self.local.budgets(now_ms);
        let cooldown_left = self.last_shared.cooldown_until.filter(|until| *until > now).map(|until| until - now);
        // What the store last said is left of the day (in the gate's clock), and what this
        // process was granted since.
        let (day_left, (day_used_since, day_used_from)) = self.shared.as_deref().and_then(store::day_left).map_or(
            (None, ((0, 0), ChargeStart::default())),
            |(left, at)| {
                let ago = duration_ms(std::time::Instant::now().saturating_duration_since(at));
                (Some((left, now_ms.saturating_sub(ago))), self.day_usage.since(at))
            },
        );
        let start = FallbackStart {
            live,
            last_shared: LastShared {
                state: self.last_shared.state,
                wave: self.last_shared.wave,
                cooldown_left_ms: cooldown_left.map(duration_ms),
            },
            recent_grants: self.recent_grants.iter().copied().collect(),
            day_left,
            day_used_since,
            day_used_from,
            learned,
            held: self.held.iter().map(|(id, held)| (id.clone(), held.wave)).collect(),
            windows: self.local.provider_windows(),
        };
        let (gate, share, held) = ProcessGate::fallback(&self.config, start, now_ms);
        for (id, wave) in held {
            if let Some(held) = self.held.get_mut(&id) {
                held.wave = wave;
            }
        }
        let entry_wave = gate.wave().wave;
        gate.join(self.instance.clone(), self.me.clone());
        let gate = Arc::new(gate);
        // 429s whose report failed before the switch still cool this process down, once per
        // shared wave (a 429 of an older shared wave is late and cuts nothing).
        let unreported = std::mem::take(&mut self.outage.unreported_429s);
        let mut rate_limited = None;
        for (wave, retry_after) in unreported {
            if wave >= self.last_shared.wave {
                let carrier = PermitId::new(None, &self.instance, 0, None);
                let signal = WaveSignal::RateLimited { retry_after };
                let released = gate.release(&self.instance, &carrier, entry_wave, signal, 0.into(), now_ms);
                if matches!(released.rate_limit, Some(wavegate_core::RateLimitEffect::Cut { .. })) {
                    rate_limited = Some(retry_after);
                }
            }
        }
        // Keep what a failed call just recorded (a release or an acquire whose reply was lost).
        let unreleased = std::mem::take(&mut self.outage.unreleased);
        self.outage = OutageBook {
            registered: self.held.keys().cloned().collect(),
            unreleased,
            entry_wave,
            rate_limited,
            usage_id: super::book::usage_id(),
            ..OutageBook::default()
        };
        self.local = gate.clone();
        self.gate = Gate::Local(gate);
        self.pumping = false;
        self.wake_pending = false;
        self.blocked_until = None;
        tracing::warn!(upstream = %self.name(), fallback_limit = share.get(), held = self.held.len(), "fallback share");
    }

    /// A 429 whose report to the store failed: it cools this process's fallback down once it
    /// has one.
    pub(super) fn pending_429(&mut self, release: Release) {
        let WaveSignal::RateLimited { retry_after } = release.signal else { return };
        if self.mode == Mode::Fallback {
            let now_ms = self.clock.now_ms();
            if release.wave >= self.last_shared.wave {
                let signal = WaveSignal::RateLimited { retry_after };
                let entry_wave = self.outage.entry_wave;
                let released = self.local.release(&self.instance, &release.id, entry_wave, signal, 0.into(), now_ms);
                if matches!(released.rate_limit, Some(wavegate_core::RateLimitEffect::Cut { .. })) {
                    self.outage.rate_limited = Some(retry_after);
                }
            }
        } else {
            self.outage.unreported_429s.push((release.wave, retry_after));
        }
    }

    /// What this lane's reconciliation sends.
    fn plan(&mut self) -> Plan {
        let now_ms = self.clock.now_ms();
        let local = self.local.snapshot(now_ms);
        let cooling = (local.state == WaveState::Cooldown).then_some(local.cooldown_remaining);
        let carry = match self.outage.rate_limited {
            // A 429 seen here during the outage.
            Some(_) if local.state != WaveState::Normal => Some((cooling, true)),
            // A shared cooldown carried into the fallback, still running: the store must not
            // have forgotten it (an empty restart does).
            _ => cooling.map(|rest| (Some(rest), false)),
        };
        let (requests, tokens) = (self.outage.granted, u64::try_from(self.outage.tokens).unwrap_or(0));
        // What this process last heard is left of the day, as of now and before this outage's
        // usage (charged apart): a store that forgot its state takes it back.
        let day_left = self.shared.as_deref().and_then(store::day_left).map(|(left, at)| {
            let ago = duration_ms(std::time::Instant::now().saturating_duration_since(at));
            let ((used_requests, used_tokens), from) = self.day_usage.since(at);
            let used = (used_requests.saturating_sub(requests), used_tokens.saturating_sub(tokens));
            left.after(self.config.budgets(), now_ms.saturating_sub(ago), (used, from), now_ms)
        });
        Plan {
            adopt: self.held.keys().cloned().collect(),
            drop: self.outage.unreleased.iter().filter(|id| !self.held.contains_key(*id)).cloned().collect(),
            lease: self.config.permit_ttl(),
            // Charged to the day budgets from the latest start its grants' times allow.
            usage: OutageUsage::new(
                requests,
                tokens,
                self.outage
                    .charge_start
                    .at_ms()
                    .map_or(Duration::ZERO, |at| Duration::from_millis(now_ms.saturating_sub(at))),
            )
            .with_day_left(day_left)
            .with_id(self.outage.usage_id),
            carry,
            carry_back: self.last_shared.state,
        }
    }

    /// Back in shared mode after a reconciliation (or without one, when the store refused it:
    /// the lease watchdog registers the permits again).
    fn back_to_shared(&mut self, epoch: u64) {
        self.epoch = epoch;
        self.reconciling = false;
        let Some(shared) = self.shared.clone() else { return };
        self.set_mode(Mode::Shared);
        store::release_day_word(&shared);
        match self.reconciled.take() {
            Some(reconciled) => {
                for held in self.held.values_mut() {
                    held.wave = reconciled.adopted_wave;
                }
            }
            None => tracing::error!(upstream = %self.name(), "back in shared mode without a reconciliation"),
        }
        // Registrations recorded while the reconciliation ran (a stale reply that came in then)
        // were not in its plan: dropped once shared (`replay_deferred` runs after this).
        let mut late = std::mem::take(&mut self.outage).unreleased;
        late.retain(|id| !self.held.contains_key(id));
        self.late_drops = late.into_iter().collect();
        let share = self.local.base_limit() as usize;
        self.rejoin_cap = Some((Instant::now() + REJOIN_GRACE, share));
        let (_, _, learned) = self.local.budgets(self.clock.now_ms());
        let local = ProcessGate::after_fallback(&self.config, learned);
        local.join(self.instance.clone(), self.me.clone());
        self.local = Arc::new(local);
        self.gate = Gate::Shared(shared);
        self.pumping = false;
        self.blocked_until = None;
        self.cooldown_until = None;
    }

    /// Records a change of mode.
    fn set_mode(&mut self, to: Mode) {
        let from = std::mem::replace(&mut self.mode, to);
        metrics::upstream_mode(self.config.name().as_str(), Some(from), to);
        if to == Mode::Shared && from != Mode::Shared {
            // Back in shared mode: the safety net's turn starts over (the switch's handler
            // looks at the live settings at once).
            self.live_looked = None;
        }
    }

    /// Replays the releases deferred while reconciling, and drops the late registrations.
    fn replay_deferred(&mut self, ctx: &mut Context<Self>) {
        if self.reconciling {
            return;
        }
        for id in std::mem::take(&mut self.late_drops) {
            self.drop_registration(id, (0, 0), ctx);
        }
        for finish in std::mem::take(&mut self.deferred) {
            self.finish(finish, ctx);
        }
        self.answer_drains();
    }

    /// The mode as reported: a fallback the store caused by rejecting wavegate is `Rejected`.
    pub(super) fn reported_mode(&self) -> Mode {
        match (&self.store, self.mode) {
            (Some(store), Mode::Fallback) if store::rejected(store) => Mode::Rejected,
            (_, mode) => mode,
        }
    }
}
