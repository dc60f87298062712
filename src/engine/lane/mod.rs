//! A lane: one upstream's actor. It is the upstream's supervisor (its circuit breaker and
//! retry budget) and owns everything one upstream's permits need in this process — its waiters,
//! the permits it holds, the gate in charge and the epoch of that gate, the acquire loop, the
//! releases, the lease watchdog.
//!
//! * **Admission** (`admission.rs`): every attempt is checked once, in one place — spent quota,
//!   breaker and retry budget, unknown class, an estimate that never fits, a full queue — then
//!   waits in the lane's queue.
//! * **Acquire loop** (`pump.rs`): serves the heads of the queue, one gate call at a time; only
//!   the heads are asked for, so the store's load grows with processes, not waiting callers.
//! * **Releases** (`release.rs`): a permit's outcome goes to the gate in charge; a call
//!   cancelled at the provider keeps its permit until the provider has plausibly finished.
//! * **Modes** (`outage.rs`): the coordinator tells the lane which gate is in charge (shared,
//!   or this process's fallback share) and asks it to reconcile when the store is back.

mod admission;
mod outage;
mod pump;
mod release;
mod status;
mod waiters;

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use actix::{Actor, AsyncContext, Context, Handler, Message, MessageResult, Recipient, SpawnHandle};
use tokio::sync::oneshot;
use wavegate_core::{CircuitBreaker, Instance, PermitId, RetryBudget, UpstreamConfig, WaveState};

use super::clock::{EngineClock, Instant};
use super::gate::Gate;
use super::grant::{Finish, Grant};
use super::process_gate::ProcessGate;
use super::request::{AttemptKind, Request};
use super::store::{Reconciled, SharedGate, Store, StoreError};
use crate::error::Error;
use crate::metrics;
use crate::quota::QuotaBlock;
use crate::status::{Mode, UpstreamStatus};
pub(crate) use outage::{Reconcile, Switch};
pub(crate) use status::{Headroom, ReadHeadroom};
use waiters::Waiters;

/// How often the budget gauges are refreshed.
const BUDGET_GAUGES_EVERY: Duration = Duration::from_secs(1);

/// The longest a drain waits for releases on their way to the shared store.
pub(crate) const DRAIN_BOUND: Duration = Duration::from_secs(1);

/// Queue for a permit of this lane's upstream until `wait_until`; the answer comes on `reply`.
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub(crate) struct Acquire {
    pub(crate) request: Request,
    pub(crate) kind: AttemptKind,
    pub(crate) wait_until: Instant,
    pub(crate) reply: oneshot::Sender<Result<Grant, Error>>,
}

/// Something may have freed a permit (a release announced on pub/sub): ask again.
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub(crate) struct Wake;

/// Read the upstream's status as this process sees it (the shared store's part included).
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub(crate) struct ReadStatus {
    pub(crate) reply: oneshot::Sender<UpstreamStatus>,
}

/// The mode of this lane's upstream.
#[derive(Debug, Message)]
#[rtype(result = "Mode")]
pub(crate) struct ReadMode;

/// Answered once no release of this lane is on its way to the shared store (at once in local
/// mode, or after [`DRAIN_BOUND`]).
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub(crate) struct Drain {
    pub(crate) reply: DrainReply,
}

/// Where a [`Drain`]'s answer goes: a thread that blocks on it (the last handle's drop), or a
/// task that awaits it (`Scheduler::shutdown`).
#[derive(Debug)]
pub(crate) enum DrainReply {
    Blocking(std::sync::mpsc::Sender<()>),
    Async(oneshot::Sender<()>),
}

impl DrainReply {
    /// Answers (a waiter that gave up is no matter).
    fn send(self) {
        match self {
            DrainReply::Blocking(reply) => drop(reply.send(())),
            DrainReply::Async(reply) => drop(reply.send(())),
        }
    }
}

/// A store call of lane `upstream`, made under `epoch`, failed: the coordinator decides what
/// it means for the failure domain (an outage switches it to fallback).
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub(crate) struct StoreTrouble {
    pub(crate) upstream: usize,
    pub(crate) epoch: u64,
    pub(crate) command: &'static str,
    pub(crate) error: StoreError,
}

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

/// A permit this process holds.
#[derive(Debug)]
struct Held {
    /// Its wave, in the numbering of the gate in charge.
    wave: u64,
    /// Its class (index; 0 without classes).
    class: usize,
    /// Its call was cancelled while at the provider: released when this timer fires.
    holding: Option<SpawnHandle>,
}

/// One upstream's lane (see the module docs).
#[derive(Debug)]
pub(crate) struct Lane {
    upstream: usize,
    config: UpstreamConfig,
    instance: Instance,
    /// The sequence number of the last permit id made here.
    sequence: u64,
    clock: EngineClock,
    /// The gate in charge.
    gate: Gate,
    /// The in-process gate: in charge in local mode and fallback; in shared mode it still hears
    /// every provider report and learned limit, so a fallback starts knowing them.
    local: Arc<ProcessGate>,
    /// The shared store's gate (kept in fallback, for the reconciliation), and the store (for
    /// its health).
    shared: Option<Arc<SharedGate>>,
    store: Option<Store>,
    mode: Mode,
    /// Bumped at every change of mode (told by the coordinator): replies to calls made under
    /// another epoch are stale.
    epoch: u64,
    /// An outage was reported to the coordinator and its switch has not arrived yet.
    switching: bool,
    /// Reconciling with the store: waiters wait, finishes are deferred.
    reconciling: bool,
    deferred: Vec<Finish>,
    /// What the last reconciliation left in the store, until the switch back uses it.
    reconciled: Option<Reconciled>,
    /// Registrations to drop once back in shared mode.
    late_drops: Vec<PermitId>,
    waiters: Waiters,
    held: HashMap<PermitId, Held>,
    /// A gate call of the acquire loop is in flight.
    pumping: bool,
    /// A wake arrived while one was in flight: ask again as soon as it returns.
    wake_pending: bool,
    retry_timer: Option<SpawnHandle>,
    /// Nobody can be admitted before this (a cooldown, a budget).
    blocked_until: Option<Instant>,
    cooldown_until: Option<Instant>,
    last_shared: LastShared,
    outage: outage::OutageBook,
    /// Just back in shared mode: until then hold at most this many permits (the fallback's
    /// share), while the other processes may still be in their fallback.
    rejoin_cap: Option<(Instant, usize)>,
    /// This process's grants (when, tokens) over the last minute, when there are rate budgets:
    /// a fallback gate starts with them charged.
    recent_grants: VecDeque<(u64, u64)>,
    /// Whether the learned-limit gauges were last set to a limit.
    learned_recorded: bool,
    breaker: CircuitBreaker,
    retry_budget: RetryBudget,
    quota: Arc<QuotaBlock>,
    /// Releases sent to the store whose reply has not come back, and drains waiting for them.
    releases_in_flight: usize,
    drains: Vec<DrainReply>,
    coordinator: Recipient<StoreTrouble>,
}

/// What a lane starts with.
#[derive(Debug)]
pub(crate) struct LaneSetup {
    pub(crate) upstream: usize,
    pub(crate) config: UpstreamConfig,
    pub(crate) instance: Instance,
    pub(crate) shared: Option<SharedGate>,
    pub(crate) store: Option<Store>,
    pub(crate) quota: Arc<QuotaBlock>,
    pub(crate) coordinator: Recipient<StoreTrouble>,
}

impl Lane {
    pub(crate) fn new(setup: LaneSetup) -> Self {
        let LaneSetup { upstream, config, instance, shared, store, quota, coordinator } = setup;
        let shared = shared.map(Arc::new);
        let local = Arc::new(ProcessGate::new(&config));
        let (gate, mode) = match &shared {
            Some(shared) => (Gate::Shared(shared.clone()), Mode::Shared),
            None => (Gate::Local(local.clone()), Mode::Local),
        };
        Self {
            upstream,
            waiters: Waiters::new(config.classes().len()),
            breaker: CircuitBreaker::new(*config.breaker()),
            retry_budget: RetryBudget::new(*config.retry_budget()),
            config,
            instance,
            sequence: 0,
            clock: EngineClock::new(),
            gate,
            local,
            shared,
            store,
            mode,
            epoch: 0,
            switching: false,
            reconciling: false,
            deferred: Vec::new(),
            reconciled: None,
            late_drops: Vec::new(),
            held: HashMap::new(),
            pumping: false,
            wake_pending: false,
            retry_timer: None,
            blocked_until: None,
            cooldown_until: None,
            last_shared: LastShared::default(),
            outage: outage::OutageBook::default(),
            rejoin_cap: None,
            recent_grants: VecDeque::new(),
            learned_recorded: false,
            quota,
            releases_in_flight: 0,
            drains: Vec::new(),
            coordinator,
        }
    }

    fn name(&self) -> &str {
        self.config.name().as_str()
    }

    /// The class of a permit of this upstream (0 without classes; the default class for an id
    /// that names none or one this process does not know).
    fn class_of(&self, id: &PermitId) -> usize {
        id.class().and_then(|name| self.config.class_index(name)).unwrap_or(self.config.default_class())
    }

    /// A store call made under `epoch` failed: an outage is the coordinator's to switch (this
    /// lane stops asking the store until it has); anything else is logged and asked again later.
    fn on_store_error(&mut self, epoch: u64, command: &'static str, error: StoreError, ctx: &mut Context<Self>) {
        if epoch != self.epoch {
            return;
        }
        metrics::redis_error(command, error.label());
        if error.is_outage() {
            self.switching = true;
            let trouble = StoreTrouble { upstream: self.upstream, epoch, command, error };
            self.coordinator.do_send(trouble);
            // Should the switch never come (a coordinator that is gone), ask again anyway.
            self.retry_in(pump::SWITCH_BOUND, ctx);
        } else {
            tracing::error!(upstream = %self.name(), command, %error, "shared store error");
            self.retry_in(pump::jittered(pump::STORE_ERROR_RETRY), ctx);
        }
    }

    /// One release fewer on its way to the store: drains waiting for none are answered.
    fn release_done(&mut self) {
        self.releases_in_flight = self.releases_in_flight.saturating_sub(1);
        if self.releases_in_flight == 0 && !self.reconciling {
            for drain in self.drains.drain(..) {
                drain.send();
            }
        }
    }
}

impl Actor for Lane {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        let name = self.config.name().as_str();
        metrics::upstream_mode(name, None, self.mode);
        metrics::wave(name, WaveState::Normal, self.config.limit().get(), 1);
        metrics::permits_in_flight(name, "local", 0);
        metrics::queue_depth(name, 0);
        metrics::breaker(name, None, self.breaker.state().as_str());
        if self.config.renews_leases() {
            ctx.run_interval(self.config.renew_every(), |act, ctx| act.renew(ctx));
        }
        // Every upstream may come to have a budget: a learned limit is one.
        ctx.run_interval(BUDGET_GAUGES_EVERY, |act, ctx| act.record_budgets(ctx));
    }
}

impl Handler<Acquire> for Lane {
    type Result = ();

    fn handle(&mut self, acquire: Acquire, ctx: &mut Context<Self>) {
        self.admit(acquire, ctx);
    }
}

impl Handler<Finish> for Lane {
    type Result = ();

    fn handle(&mut self, finish: Finish, ctx: &mut Context<Self>) {
        self.finish(finish, ctx);
    }
}

impl Handler<Wake> for Lane {
    type Result = ();

    fn handle(&mut self, _: Wake, ctx: &mut Context<Self>) {
        self.pump(ctx);
    }
}

impl Handler<ReadMode> for Lane {
    type Result = MessageResult<ReadMode>;

    fn handle(&mut self, _: ReadMode, _: &mut Context<Self>) -> Self::Result {
        MessageResult(self.reported_mode())
    }
}

impl Handler<Drain> for Lane {
    type Result = ();

    fn handle(&mut self, drain: Drain, ctx: &mut Context<Self>) {
        if self.releases_in_flight == 0 && !self.reconciling {
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
