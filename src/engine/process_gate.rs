//! The in-process gate: [`LocalGate`], the Rust twin of the scripts, behind a lock.
//!
//! Local mode's gate, and each fallback's (a fallback builds its own from the shared state it
//! last saw, [`LocalGate::fallback`]). The lanes that ask at one gate are its members: a
//! release wakes the member the gate names, as `finish.lua` announces one on the release
//! channel.

use std::num::NonZeroU32;

use actix::WeakRecipient;
use parking_lot::Mutex;
use wavegate_core::{
    Ask, BudgetStatus, Budgets, Decision, FallbackStart, Hold, Instance, LearnedBudgets, LiveBoard, LiveChange,
    LiveSettings, LocalGate, PermitId, ProviderWindows, TokenDelta, UpstreamConfig, WaveSignal, WaveSnapshot,
    WindowReport,
};

use super::store::{Released, Snapshot};
use super::wake::{Handed, HandedBy, Wake};

/// One upstream's in-process gate and the lanes that ask at it.
#[derive(Debug)]
pub(crate) struct ProcessGate {
    gate: Mutex<LocalGate>,
    /// The lanes asking at this gate, by their instance: a release wakes the one it names.
    /// (Held weakly: a gate does not keep its lanes alive.)
    members: Mutex<Vec<(Instance, WeakRecipient<Wake>)>>,
    /// The live settings of local mode (an operator's changes, with their version), shared by
    /// the lanes asking here as the store's are by the fleet.
    live: Mutex<LiveBoard>,
    /// This gate's number ([`number`](Self::number)).
    number: u64,
}

impl ProcessGate {
    /// The gate of `config`'s upstream, empty, in NORMAL, with its configured budgets.
    pub(crate) fn new(config: &UpstreamConfig) -> Self {
        Self::with_gate(LocalGate::for_upstream(config))
    }

    fn with_gate(gate: LocalGate) -> Self {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        Self {
            gate: Mutex::new(gate),
            members: Mutex::new(Vec::new()),
            live: Mutex::new(LiveBoard::default()),
            number: NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
        }
    }

    /// The gate of a fallback: this process's share of the limit and the budgets, what it last
    /// saw of the shared state carried on, each permit of `held` adopted (its wave turned into
    /// the gate's numbering in place). Returns the gate and its share.
    pub(crate) fn fallback(
        config: &UpstreamConfig,
        start: FallbackStart<PermitId>,
        now_ms: u64,
    ) -> (Self, NonZeroU32, Vec<(PermitId, u64)>) {
        let fallback = LocalGate::fallback(config, start, now_ms);
        (Self::with_gate(fallback.gate), fallback.share, fallback.held)
    }

    /// The gate after a fallback, back in shared mode: empty, the configured budgets, what the
    /// provider announced kept.
    pub(crate) fn after_fallback(config: &UpstreamConfig, learned: LearnedBudgets) -> Self {
        Self::with_gate(LocalGate::for_upstream(config).with_learned(learned, 1))
    }

    /// This gate's number, which names it in the permits it hands ([`HandedBy::Local`]): no
    /// two gates of a process share one, whenever they lived.
    pub(crate) fn number(&self) -> u64 {
        self.number
    }

    /// `instance`'s lane asks at this gate from now on (and is woken by the releases that name
    /// it).
    pub(crate) fn join(&self, instance: Instance, lane: WeakRecipient<Wake>) {
        let mut members = self.members.lock();
        members.retain(|(known, _)| *known != instance);
        members.push((instance, lane));
    }

    /// How many lanes ask at this gate (schedulers of this process sharing it).
    pub(crate) fn members(&self) -> usize {
        self.members.lock().len()
    }

    /// `instance`'s lane asks no more.
    pub(crate) fn leave(&self, instance: &Instance) {
        self.members.lock().retain(|(known, _)| known != instance);
    }

    /// One permit for the first of `instance`'s `asks` (non-empty) the choice reaches.
    pub(crate) fn acquire(&self, instance: &Instance, asks: &[Ask], lease_ms: u64, now_ms: u64) -> Decision {
        self.gate.lock().acquire(instance, asks, lease_ms, now_ms)
    }

    /// Releases `id` with its outcome for `wave`, settling `token_delta` tokens; wakes the
    /// member the gate names for the freed permit, unless it is `instance` (which asks again
    /// on its own), and hands it the permit when the gate granted it one (`instance` too).
    pub(crate) fn release(
        &self,
        instance: &Instance,
        id: &PermitId,
        wave: u64,
        signal: WaveSignal,
        token_delta: TokenDelta,
        now_ms: u64,
    ) -> Released {
        let report = self.gate.lock().finish(id, wave, signal, token_delta, now_ms);
        let (mut wake, mut handed) = (report.wake.clone(), report.handed.clone());
        let mut after = (report.after, report.in_flight);
        loop {
            let lane = wake.as_ref().and_then(|wake| {
                let members = self.members.lock();
                members.iter().find(|(known, _)| known == wake).and_then(|(_, lane)| lane.upgrade())
            });
            match (handed.take(), lane) {
                // A permit handed goes to its lane, this one included.
                (Some((id, wave)), Some(lane)) => {
                    let by = HandedBy::Local(self.number);
                    let (state, limit) = (after.0.state, after.0.limit);
                    lane.do_send(Wake { handed: Some(Handed { id, wave, state, limit, by }) });
                }
                // Its lane is gone (its scheduler stopped): given back at once, which may hand
                // it to the next on the list.
                (Some((id, wave)), None) => {
                    let back = self.gate.lock().finish(&id, wave, WaveSignal::Neutral, TokenDelta::default(), now_ms);
                    (wake, handed, after) = (back.wake, back.handed, (back.after, back.in_flight));
                    continue;
                }
                // A plain wake-up to another lane.
                (None, Some(lane)) if wake.as_ref() != Some(instance) => lane.do_send(Wake::ASK),
                (None, _) => {}
            }
            break;
        }
        Released { held: report.held, rate_limit: report.rate_limit, after: snapshot(after.0, after.1, now_ms) }
    }

    /// Extends the leases of `ids`; returns those that were no longer held (registered again).
    pub(crate) fn renew(&self, ids: &[PermitId], now_ms: u64, lease_ms: u64) -> Vec<PermitId> {
        self.gate.lock().renew(ids, now_ms, lease_ms)
    }

    /// Takes in what a response to `id` said is left of the provider's windows.
    pub(crate) fn report_window(&self, id: &PermitId, report: WindowReport, now_ms: u64, tokens_each: u64) {
        self.gate.lock().report_window(id.as_str(), report, now_ms, tokens_each);
    }

    /// Forgets the provider's windows (an operator's clear).
    pub(crate) fn clear_windows(&self) {
        self.gate.lock().clear_windows();
    }

    /// The wave state and the permits held.
    pub(crate) fn snapshot(&self, now_ms: u64) -> Snapshot {
        let (wave, held) = self.gate.lock().status(now_ms);
        snapshot(wave, u32::try_from(held).unwrap_or(u32::MAX), now_ms)
    }

    /// The fleet's (here: this gate's) permits in flight and callers waiting, per class.
    pub(crate) fn classes(&self, now_ms: u64) -> Vec<(u32, u32)> {
        self.gate.lock().status_with_classes(now_ms).2
    }

    /// What is left of the budgets in force, and the limits learned.
    pub(crate) fn budgets(&self, now_ms: u64) -> (Budgets, BudgetStatus, LearnedBudgets) {
        let gate = self.gate.lock();
        (gate.budgets(now_ms), gate.budget_status(now_ms), gate.learned(now_ms))
    }

    /// The tokens burst in force (for `class`: the smaller of it and the class's own), if there
    /// is a tokens budget.
    pub(crate) fn tokens_burst(&self, class: Option<usize>, now_ms: u64) -> Option<u64> {
        let gate = self.gate.lock();
        match class {
            Some(class) if !gate.classes().is_empty() => gate.tokens_burst_for(class, now_ms),
            _ => gate.tokens_burst(now_ms),
        }
    }

    /// A proved lower bound on the time until an ask of `tokens` can be granted here
    /// ([`LocalGate::proven_hold`]). `reserved` gives the tokens each permit of this lane
    /// reserved: the tokens budget proves something only when every permit held here is one
    /// of them (a refund of any other is unknown).
    pub(crate) fn proven_hold(
        &self,
        tokens: u64,
        reserved: &std::collections::HashMap<&str, u64>,
        now_ms: u64,
    ) -> Option<Hold> {
        let gate = self.gate.lock();
        let refundable = gate
            .ledger()
            .iter()
            .filter(|(_, permit)| permit.expires_ms > now_ms)
            .map(|(id, _)| reserved.get(id).copied())
            .try_fold(0u64, |sum, tokens| tokens.map(|t| sum.saturating_add(t)));
        gate.proven_hold(tokens, refundable, now_ms)
    }

    /// What the provider said is left of its windows, as kept here.
    pub(crate) fn provider_windows(&self) -> ProviderWindows {
        self.gate.lock().provider_windows()
    }

    /// The wave machine's state.
    pub(crate) fn wave(&self) -> WaveSnapshot {
        self.gate.lock().machine().snapshot()
    }

    /// Takes a live change of `config` (the limit and the budgets in force): the wave keeps
    /// what it learned below a new limit, each budget the units it holds under a new rate.
    pub(crate) fn apply_live(&self, config: &UpstreamConfig, now_ms: u64) {
        let mut gate = self.gate.lock();
        gate.machine_mut().rebase(config.limit());
        if gate.configured() != config.budgets() {
            gate.set_budgets(config.budgets(), now_ms);
        }
        if gate.classes() != config.classes() {
            gate.set_classes(config.classes());
        }
    }

    /// Stores a live change for the lanes asking here (local mode), and wakes them (a lane
    /// woken in local mode looks at the live settings first); answers its version.
    pub(crate) fn change_live(&self, change: &LiveChange, now_ms: u64) -> u64 {
        let version = self.live.lock().apply(change, now_ms);
        for (_, lane) in self.members.lock().iter() {
            if let Some(lane) = lane.upgrade() {
                lane.do_send(Wake::ASK);
            }
        }
        version
    }

    /// The live settings at `now_ms` (an override whose time is up reverted).
    pub(crate) fn live(&self, now_ms: u64) -> LiveSettings {
        self.live.lock().read(now_ms)
    }

    /// The base limit (a fallback's share).
    pub(crate) fn base_limit(&self) -> u32 {
        self.gate.lock().machine().config().base_limit.get()
    }
}

/// A wave snapshot and the permits held, as a gate answers.
fn snapshot(wave: WaveSnapshot, in_flight: u32, now_ms: u64) -> Snapshot {
    Snapshot {
        state: wave.state,
        limit: wave.limit,
        wave: wave.wave,
        cooldown_remaining: std::time::Duration::from_millis(wave.cooldown_until_ms.saturating_sub(now_ms)),
        in_flight,
    }
}

/// The in-process gates of this process shared by name: local-mode schedulers that name one
/// upstream in one namespace share one gate — one limit, one wave, one set of budgets — as
/// processes share them through Redis. (Built inside actix-web's `HttpServer::new` factory, a
/// scheduler per worker would otherwise send the provider the limit times the workers.)
static SHARED: Mutex<Vec<Shared>> = Mutex::new(Vec::new());

/// One shared gate, held weakly: it lives as long as the lanes that ask at it.
#[derive(Debug)]
struct Shared {
    namespace: String,
    config: UpstreamConfig,
    gate: std::sync::Weak<ProcessGate>,
}

/// The in-process gate of `config`'s upstream in `namespace`: the one another local scheduler
/// of this process already uses, if it has the same configuration; otherwise a new one
/// (another configuration of the same upstream gets a gate of its own, and an error in the
/// log, since two limits then add up at the provider).
pub(crate) fn shared(namespace: &str, config: &UpstreamConfig) -> std::sync::Arc<ProcessGate> {
    let mut shared = SHARED.lock();
    shared.retain(|entry| entry.gate.strong_count() > 0);
    let same_name = |entry: &&Shared| entry.namespace == namespace && entry.config.name() == config.name();
    if let Some(gate) = shared.iter().filter(same_name).find(|e| e.config == *config).and_then(|e| e.gate.upgrade()) {
        return gate;
    }
    if shared.iter().any(|entry| same_name(&entry)) {
        tracing::error!(
            upstream = %config.name(),
            namespace,
            "another local scheduler of this process names this upstream with another configuration: each has a \
             limit of its own and the provider sees their sum; configure it once, or give each its own key prefix"
        );
    }
    let gate = std::sync::Arc::new(ProcessGate::new(config));
    shared.push(Shared {
        namespace: namespace.to_owned(),
        config: config.clone(),
        gate: std::sync::Arc::downgrade(&gate),
    });
    gate
}
