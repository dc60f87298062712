//! The lane actor's state, its start, and the messages it answers directly.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32};
use std::time::Duration;

use actix::{Actor, AsyncContext, Context, Handler, MessageResult, Recipient, SpawnHandle, WeakRecipient};
use wavegate_core::{
    CircuitBreaker, HeardDenial, Instance, LiveSettings, PermitId, RetryBudget, UpstreamConfig, WaveState,
};

use super::book::OutageBook;
use super::day_usage::DayUsage;
use super::gauges::Gauges;
use super::messages::{Acquire, DRAIN_BOUND, Drain, DrainReply, ReadMode, StoreTrouble};
use super::pace::Pace;
use super::tally::Tally;
use super::waiters::Waiters;
use crate::engine::clock::{EngineClock, Instant};
use crate::engine::gate::Gate;
use crate::engine::grant::Finish;
use crate::engine::process_gate::{self, ProcessGate};
use crate::engine::store::{Reconciled, SharedGate, Store};
use crate::engine::wake::Wake;
use crate::history::{HISTORY_EVERY, HistoryRing};
use crate::metrics;
use crate::pool_membership::PoolMembership;
use crate::quota::QuotaBlock;
use crate::shadow::ShadowTally;
use crate::status::Mode;

/// How often the budget gauges are refreshed.
const BUDGET_GAUGES_EVERY: Duration = Duration::from_secs(1);

/// How often the lane's live-settings timer fires: the in-process board (local mode) is read
/// each time, the store's (shared mode) once every `LIVE_SAFETY_NET_HEARD` or `LIVE_SAFETY_NET`
/// (`live.rs`).
const LIVE_EVERY: Duration = Duration::from_secs(1);

/// What this process knows of an upstream's shared state, from the last script replies.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct LastShared {
    /// When a shared cooldown ends, if one was seen.
    pub(super) cooldown_until: Option<Instant>,
    /// The last state and limit seen, if any.
    pub(super) state: Option<(WaveState, u32)>,
    /// The last shared wave seen (0: none yet).
    pub(super) wave: u64,
    /// The permits held by the fleet as the gate in charge last said, and when.
    pub(super) in_flight: Option<(u32, Instant)>,
}

/// A permit this process holds.
#[derive(Debug)]
pub(super) struct Held {
    /// Its wave, in the numbering of the gate in charge.
    pub(super) wave: u64,
    /// Its class (index; 0 without classes).
    pub(super) class: usize,
    /// Its call was cancelled while at the provider: released when this timer fires.
    pub(super) holding: Option<SpawnHandle>,
    /// The tokens it reserved (what a settlement may give back).
    pub(super) tokens: u64,
}

/// One upstream's lane (see the module docs).
#[derive(Debug)]
pub(crate) struct Lane {
    pub(super) upstream: usize,
    pub(super) config: UpstreamConfig,
    pub(super) instance: Instance,
    /// The sequence number of the last permit id made here.
    pub(super) sequence: u64,
    pub(super) clock: EngineClock,
    /// The gate in charge.
    pub(super) gate: Gate,
    /// The in-process gate: in charge in local mode and fallback; in shared mode it still hears
    /// every provider report and learned limit, so a fallback starts knowing them.
    pub(super) local: Arc<ProcessGate>,
    /// The shared store's gate (kept in fallback, for the reconciliation), and the store (for
    /// its health).
    pub(super) shared: Option<Arc<SharedGate>>,
    pub(super) store: Option<Store>,
    pub(super) mode: Mode,
    /// Bumped at every change of mode (told by the coordinator): replies to calls made under
    /// another epoch are stale.
    pub(super) epoch: u64,
    /// An outage was reported to the coordinator and its switch has not arrived yet.
    pub(super) switching: bool,
    /// Reconciling with the store: waiters wait, finishes are deferred.
    pub(super) reconciling: bool,
    pub(super) deferred: Vec<Finish>,
    /// What the last reconciliation left in the store, until the switch back uses it.
    pub(super) reconciled: Option<Reconciled>,
    /// Registrations to drop once back in shared mode.
    pub(super) late_drops: Vec<PermitId>,
    pub(super) waiters: Waiters,
    pub(super) held: HashMap<PermitId, Held>,
    /// A gate call of the acquire loop is in flight.
    pub(super) pumping: bool,
    /// A wake arrived while one was in flight: ask again as soon as it returns.
    pub(super) wake_pending: bool,
    /// Acquires sent to the store so far: a release's reply asks again only when no acquire
    /// sent after the release is in flight (that one saw the room the release freed).
    pub(super) acquires_sent: u64,
    pub(super) retry_timer: Option<SpawnHandle>,
    /// Nobody can be admitted before this (a cooldown, a budget).
    pub(super) blocked_until: Option<Instant>,
    pub(super) cooldown_until: Option<Instant>,
    /// The end of the provider's window that refused this lane's last ask, as the gate said:
    /// the hint a caller refused meanwhile is given.
    pub(super) window_until: Option<Instant>,
    /// The gate's last denial as heard, under the epoch it was heard in (see `deadline.rs`).
    pub(super) heard: Option<(u64, HeardDenial)>,
    /// When the acquire loop's last gate call was made (clock ms).
    pub(super) asked_at_ms: u64,
    pub(super) last_shared: LastShared,
    pub(super) outage: OutageBook,
    /// Just back in shared mode: until then hold at most this many permits (the fallback's
    /// share), while the other processes may still be in their fallback.
    pub(super) rejoin_cap: Option<(Instant, usize)>,
    /// This process's grants (when, tokens) over the last minute, when there are rate budgets:
    /// a fallback gate starts with them charged.
    pub(super) recent_grants: VecDeque<(u64, u64, u64)>,
    /// This process's grants since the store last said what is left of the day budgets: a
    /// fallback charges them to its day shares.
    pub(super) day_usage: DayUsage,
    /// The gauges, as last written.
    pub(super) gauges: Gauges,
    /// This process's recent grants, for the status's expected wait.
    pub(super) pace: Pace,
    /// Whether the learned-limit gauges were last set to a limit.
    pub(super) learned_recorded: bool,
    /// Whether this process reads the shared gauges for the fleet (see `record_budgets`).
    pub(super) gauge_reader: Arc<AtomicBool>,
    /// Whether this process hears the live changes announced: the look without an
    /// announcement is then the slower safety net (`live.rs`).
    pub(super) hears_changes: Arc<AtomicBool>,
    /// The processes live in the fleet at the last heartbeat (0: not known; set by the
    /// coordinator): shadow mode judges a failure by this process's calls alone only when it is
    /// the only one (`shadow.rs`).
    pub(super) fleet_size: Arc<AtomicU32>,
    /// The counts since the last history sample, and the history (see `sampler.rs`).
    pub(super) tally: Tally,
    pub(super) history: Arc<HistoryRing>,
    pub(super) breaker: CircuitBreaker,
    pub(super) retry_budget: RetryBudget,
    pub(super) quota: Arc<QuotaBlock>,
    /// The upstream's live weights in pools, for the pools' requests (`pool_membership.rs`).
    pub(super) membership: Arc<PoolMembership>,
    /// Releases sent to the store whose reply has not come back, and drains waiting for them.
    pub(super) releases_in_flight: usize,
    pub(super) drains: Vec<DrainReply>,
    pub(super) coordinator: Recipient<StoreTrouble>,
    /// This lane, to be woken by the in-process gate's releases.
    pub(super) me: WeakRecipient<Wake>,
    /// The configuration this process was built with (`config` holds the one in force, with
    /// the live settings applied).
    pub(super) configured: UpstreamConfig,
    /// The live settings last applied, and whether any were read yet.
    pub(super) live: LiveSettings,
    pub(super) live_read: bool,
    /// A look at the store's live settings is in flight.
    pub(super) live_reading: bool,
    /// A change was announced while a look was in flight: look again when it is back.
    pub(super) live_again: bool,
    /// When the store's live settings were last looked at.
    pub(super) live_looked: Option<Instant>,
    /// The look due at the end of the next override, if one runs.
    pub(super) live_timer: Option<SpawnHandle>,
    /// What shadow mode recorded (`shadow.rs`).
    pub(super) shadow: ShadowTally,
    /// When the acquire loop last asked the gate.
    pub(super) asked_at: Instant,
    /// Until when the fleet knows of this upstream's spent quota, as this process told it or
    /// heard it (`quota.rs`).
    pub(super) quota_told: Option<Instant>,
}

/// What a lane starts with.
#[derive(Debug)]
pub(crate) struct LaneSetup {
    pub(crate) upstream: usize,
    pub(crate) config: UpstreamConfig,
    pub(crate) instance: Instance,
    pub(crate) shared: Option<SharedGate>,
    pub(crate) store: Option<Store>,
    /// In local mode, the namespace whose in-process gate of this upstream the lane shares
    /// with the process's other local schedulers (`None`: a gate of its own).
    pub(crate) namespace: Option<Arc<str>>,
    pub(crate) quota: Arc<QuotaBlock>,
    /// Where the lane keeps its second-by-second history.
    pub(crate) history: Arc<HistoryRing>,
    /// Where the lane writes the upstream's live weights in pools.
    pub(crate) membership: Arc<PoolMembership>,
    pub(crate) coordinator: Recipient<StoreTrouble>,
    /// Whether this process is the fleet's gauge reader (set by the coordinator's heartbeats).
    pub(crate) gauge_reader: Arc<AtomicBool>,
    /// Whether this process hears the live changes announced (set by the coordinator).
    pub(crate) hears_changes: Arc<AtomicBool>,
    /// The processes live in the fleet (set by the coordinator's heartbeats; 0: not known).
    pub(crate) fleet_size: Arc<AtomicU32>,
}

impl Lane {
    /// The lane `setup` describes; `me` is its own address (from its context).
    pub(crate) fn new(setup: LaneSetup, me: WeakRecipient<Wake>) -> Self {
        let LaneSetup {
            upstream,
            config,
            instance,
            shared,
            store,
            namespace,
            quota,
            history,
            membership,
            coordinator,
            gauge_reader,
            hears_changes,
            fleet_size,
        } = setup;
        let shared = shared.map(Arc::new);
        let configured = config.clone();
        let local = match (&shared, &namespace) {
            (None, Some(namespace)) => process_gate::shared(namespace, &config),
            _ => Arc::new(ProcessGate::new(&config)),
        };
        local.join(instance.clone(), me.clone());
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
            acquires_sent: 0,
            retry_timer: None,
            blocked_until: None,
            cooldown_until: None,
            window_until: None,
            heard: None,
            asked_at_ms: 0,
            last_shared: LastShared::default(),
            outage: OutageBook::default(),
            rejoin_cap: None,
            recent_grants: VecDeque::new(),
            day_usage: DayUsage::default(),
            gauges: Gauges::default(),
            pace: Pace::default(),
            learned_recorded: false,
            gauge_reader,
            hears_changes,
            fleet_size,
            tally: Tally::default(),
            history,
            membership,
            quota,
            releases_in_flight: 0,
            drains: Vec::new(),
            coordinator,
            me,
            configured: configured.clone(),
            live: LiveSettings::default(),
            live_read: false,
            live_reading: false,
            live_again: false,
            live_looked: None,
            live_timer: None,
            shadow: ShadowTally::default(),
            asked_at: Instant::now(),
            quota_told: None,
        }
    }

    pub(super) fn name(&self) -> &str {
        self.config.name().as_str()
    }

    /// The class of a permit of this upstream (0 without classes; the default class for an id
    /// that names none or one this process does not know).
    pub(super) fn class_of(&self, id: &PermitId) -> usize {
        id.class().and_then(|name| self.config.class_index(name)).unwrap_or(self.config.default_class())
    }
}

impl Actor for Lane {
    type Context = Context<Self>;

    fn stopped(&mut self, _: &mut Context<Self>) {
        self.local.leave(&self.instance);
    }

    fn started(&mut self, ctx: &mut Context<Self>) {
        let name = self.config.name().as_str();
        metrics::upstream_mode(name, None, self.mode);
        self.gauges.wave(name, WaveState::Normal, self.config.limit().get(), 1);
        self.gauges.local(name, 0);
        self.gauges.queue(name, 0);
        metrics::breaker(name, None, self.breaker.state().as_str());
        if self.config.renews_leases() {
            ctx.run_interval(self.config.renew_every(), |act, ctx| act.renew(ctx));
        }
        // Every upstream may come to have a budget: a learned limit is one.
        ctx.run_interval(BUDGET_GAUGES_EVERY, |act, ctx| act.record_budgets(ctx));
        // The history: a first sample now, then one a second.
        self.record_sample();
        ctx.run_interval(HISTORY_EVERY, |act, _| act.record_sample());
        // The live settings: at start (a process built with another limit adopts the fleet's),
        // then every second.
        self.check_live(ctx, None);
        ctx.run_interval(LIVE_EVERY, |act, ctx| act.look_at_live(ctx));
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

    fn handle(&mut self, wake: Wake, ctx: &mut Context<Self>) {
        if let Some(handed) = wake.handed {
            self.take_handed(handed, ctx);
        }
        if self.shared.is_none() {
            // Local mode: a live change of the in-process gate wakes its lanes too (reading
            // the board is a lock, no round trip).
            self.check_live(ctx, None);
        }
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
        // Ghosts of calls in shadow release what they hold at once, and are waited for.
        self.shadow.hurry();
        if self.releases_in_flight == 0 && !self.pumping && !self.reconciling && self.shadow.holding() == 0 {
            drain.reply.send();
            return;
        }
        // Each release (and acquire) is bounded by the command timeout, a release retry by
        // its delay; a reconciliation replays the releases it deferred once done. Past the
        // bound the caller goes on anyway.
        self.drains.push(drain.reply);
        ctx.run_later(DRAIN_BOUND, |act, _| {
            for drain in act.drains.drain(..) {
                drain.send();
            }
        });
    }
}
