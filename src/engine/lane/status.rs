//! What a lane can tell about its upstream: the status (the shared store's part read in shared
//! mode), the gauges, and the room a pool sees.

use std::sync::atomic::Ordering;

use actix::{ActorFutureExt, AsyncContext, Context, Handler, Message, MessageResult, WrapFuture};
use wavegate_core::{Budgets, Clock, LearnedBudgets, LearnedStatus};

use super::actor::Lane;
use super::messages::ReadStatus;
use crate::engine::clock::Instant;
use crate::engine::gate::Gate;
use crate::engine::store;
use crate::metrics;
use crate::status::{ClassStatus, Mode, UpstreamStatus};

/// Read the room of this lane's upstream as this process sees it (no Redis round trip).
#[derive(Debug, Message)]
#[rtype(result = "Headroom")]
pub(crate) struct ReadHeadroom;

/// One upstream's room: its current limit, this process's calls in flight and waiting, the
/// fleet's permits as the gate in charge said within [`FLEET_SEEN_FRESH`] (`None`: not heard
/// that recently), and whether no one can be admitted for now (a cooldown, a budget, a spent
/// provider window, a spent quota).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Headroom {
    pub(crate) limit: u32,
    pub(crate) held: usize,
    pub(crate) waiting: usize,
    pub(crate) fleet: Option<u32>,
    pub(crate) blocked: bool,
}

/// How long the fleet's permits as last heard stand for the pool's choice.
pub(crate) const FLEET_SEEN_FRESH: std::time::Duration = std::time::Duration::from_secs(1);

impl Headroom {
    /// Free permits: the limit less what this process holds and waits for, or less what the
    /// fleet holds (heard recently) and this process waits for, whichever is more.
    pub(crate) fn free(&self) -> i64 {
        let here = self.held.max(self.fleet.map_or(0, |held| held as usize));
        i64::from(self.limit) - i64::try_from(here + self.waiting).unwrap_or(i64::MAX)
    }
}

impl Handler<ReadHeadroom> for Lane {
    type Result = MessageResult<ReadHeadroom>;

    fn handle(&mut self, _: ReadHeadroom, _: &mut Context<Self>) -> Self::Result {
        let now = Instant::now();
        let now_ms = self.clock.now_ms();
        let limit = match (self.mode, self.last_shared.state) {
            (Mode::Shared, Some((_, limit))) => limit,
            (Mode::Shared, None) => self.config.limit().get(),
            _ => self.local.wave().limit,
        };
        let fleet = match self.last_shared.in_flight {
            Some((held, at)) if self.mode == Mode::Shared && now.duration_since(at) < FLEET_SEEN_FRESH => Some(held),
            _ => None,
        };
        MessageResult(Headroom {
            limit,
            held: self.held.len(),
            waiting: self.waiters.len(),
            fleet,
            // Refused for now: the gate said so, a cooldown runs, the provider said a window is
            // spent (as this process heard it), or the quota is spent.
            blocked: self.blocked_until.is_some_and(|until| until > now)
                || self.cooldown_until.is_some_and(|until| until > now)
                || self.local.provider_windows().wait_ms(now_ms, 0, 0).is_some()
                || self.quota.remaining().is_some(),
        })
    }
}

impl Handler<ReadStatus> for Lane {
    type Result = ();

    fn handle(&mut self, read: ReadStatus, ctx: &mut Context<Self>) {
        let mut status = self.local_status();
        let Gate::Shared(gate) = &self.gate else {
            let _ = read.reply.send(status);
            return;
        };
        let call = store::status(gate);
        ctx.spawn(call.into_actor(self).map(move |result, _, _| {
            if let Ok(shared) = result {
                for (class, (in_flight, waiting)) in status.classes.iter_mut().zip(shared.classes) {
                    class.in_flight_fleet = Some(in_flight);
                    class.waiting_fleet = Some(waiting);
                }
                status.state = shared.now.state;
                status.limit = shared.now.limit;
                status.wave = shared.now.wave;
                status.cooldown_remaining = shared.now.cooldown_remaining;
                status.in_flight_fleet = Some(shared.now.in_flight);
                status.budgets = shared.budgets;
                status.learned = shared.learned;
            }
            let _ = read.reply.send(status);
        }));
    }
}

impl Lane {
    /// The status as this process knows it (the in-process gate's view of the wave).
    fn local_status(&mut self) -> UpstreamStatus {
        let now_ms = self.clock.now_ms();
        let snapshot = self.local.snapshot(now_ms);
        let (_, budgets, learned) = self.local.budgets(now_ms);
        let mode = self.reported_mode();
        let mut status = UpstreamStatus {
            upstream: self.config.name().to_string(),
            mode,
            state: snapshot.state,
            limit: snapshot.limit,
            wave: snapshot.wave,
            cooldown_remaining: snapshot.cooldown_remaining,
            in_flight_local: self.held.len(),
            in_flight_fleet: (mode == Mode::Local).then_some(snapshot.in_flight),
            queue_depth: self.waiters.len(),
            expected_wait: None,
            breaker: self.breaker.state().as_str(),
            budgets,
            learned: learned.status(now_ms),
            quota_exhausted_for: self.quota.remaining(),
            schedulers_in_process: 0,
            classes: self.class_statuses(),
            base_limit: self.config.limit().get(),
            configured_limit: self.configured.limit().get(),
            live_version: self.live.version,
            shadow: self.shadow.status(self.config.shadow()),
        };
        status.expected_wait = self.expected_wait(None, status.queue_depth);
        if mode == Mode::Local {
            // The in-process gate is the whole fleet's: every scheduler of this process that
            // shares it.
            for (class, (in_flight, waiting)) in status.classes.iter_mut().zip(self.local.classes(now_ms)) {
                class.in_flight_fleet = Some(in_flight);
                class.waiting_fleet = Some(waiting);
            }
        }
        status
    }

    /// This process's callers waiting and permits held in each priority class.
    fn class_statuses(&mut self) -> Vec<ClassStatus> {
        if self.config.classes().is_empty() {
            return Vec::new();
        }
        let waiting = self.waiters.lens();
        let expected: Vec<_> =
            waiting.iter().enumerate().map(|(class, n)| self.expected_wait(Some(class), *n)).collect();
        let mut in_flight = vec![0; waiting.len()];
        for held in self.held.values() {
            if let Some(count) = in_flight.get_mut(held.class) {
                *count += 1;
            }
        }
        self.config
            .classes()
            .iter()
            .zip(waiting.into_iter().zip(in_flight).zip(expected))
            .map(|(class, ((waiting, in_flight_local), expected_wait))| ClassStatus {
                class: class.name().to_owned(),
                weight: class.weight_value().get(),
                reserve_percent: class.reserve_percent_value(),
                budget_percent: class.budget_percent_value(),
                waiting,
                expected_wait,
                in_flight_local,
                in_flight_fleet: None,
                waiting_fleet: None,
            })
            .collect()
    }

    /// Records the expected waits (NaN while unknown), once a second: per class, `""` for the
    /// upstream as a whole.
    fn record_expected_waits(&mut self, depth: usize) {
        let unknown = |wait: Option<std::time::Duration>| wait.map_or(f64::NAN, |w| w.as_secs_f64());
        let classes = self.class_statuses();
        let name = self.config.name().as_str();
        metrics::expected_wait(name, "", unknown(self.expected_wait(None, depth)));
        for class in classes {
            metrics::expected_wait(name, &class.class, unknown(class.expected_wait));
        }
    }

    /// Records the per-class gauges (upstreams with classes).
    pub(super) fn record_classes(&mut self) {
        for class in self.class_statuses() {
            metrics::class_load(self.config.name().as_str(), &class.class, class.waiting, class.in_flight_local);
        }
    }

    /// Records what is left of the rate budgets and the limits learned (read from the store in
    /// shared mode: one status call, for an upstream with budgets, configured or learned, by
    /// the fleet's gauge reader only — one process at a time, chosen by the heartbeats — so the
    /// fleet sends one status script per upstream per second whatever its size).
    pub(super) fn record_budgets(&mut self, ctx: &mut Context<Self>) {
        let now_ms = self.clock.now_ms();
        // Every gauge is written again at its next value (a recorder installed late gets them).
        self.gauges.forget();
        let depth = self.waiters.len();
        self.gauges.queue(self.config.name().as_str(), depth);
        self.gauges.local(self.config.name().as_str(), self.held.len());
        self.record_expected_waits(depth);
        let wave = match self.mode {
            Mode::Shared => self.last_shared.state.map(|(state, limit)| (state, limit, self.last_shared.wave)),
            _ => Some(self.local.snapshot(now_ms)).map(|s| (s.state, s.limit, s.wave)),
        };
        if let Some((state, limit, wave)) = wave {
            self.gauges.wave(self.config.name().as_str(), state, limit, wave);
        }
        let (_, budgets, learned) = self.local.budgets(now_ms);
        let name = self.config.name().as_str();
        if self.config.budgets() == Budgets::default() && learned == LearnedBudgets::default() {
            if self.learned_recorded {
                // Forgotten: the gauges say so once.
                metrics::learned(name, LearnedStatus::default());
                self.learned_recorded = false;
            }
            return;
        }
        self.learned_recorded = learned != LearnedBudgets::default();
        match &self.gate {
            Gate::Shared(_) if !self.gauge_reader.load(Ordering::Relaxed) => metrics::budgets_read_elsewhere(name),
            Gate::Shared(gate) => {
                let call = store::status(gate);
                ctx.spawn(call.into_actor(self).map(|result, act, _| {
                    if let Ok(shared) = result {
                        metrics::budgets(act.config.name().as_str(), shared.budgets);
                        metrics::learned(act.config.name().as_str(), shared.learned);
                    }
                }));
            }
            Gate::Local(_) => {
                metrics::budgets(name, budgets);
                metrics::learned(name, learned.status(now_ms));
            }
        }
    }
}
