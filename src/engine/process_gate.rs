//! The in-process gate: [`LocalGate`] behind a lock, answering the same asks as the scripts.
//!
//! Local mode's gate, and each fallback's (a fallback builds its own from the shared state it
//! last saw). The policy is wavegate-core's; this file only holds it and turns a lane's asks
//! into one call of it.

use std::collections::HashMap;

use parking_lot::Mutex;
use wavegate_core::class_budget::ClassBudgets;
use wavegate_core::priority::{ClassTurns, ClassView, next_class};
use wavegate_core::{
    Admission, Ask, BudgetStatus, Budgets, Decision, DenyReason, LearnedBudgets, LocalGate, PermitId, ProviderWindows,
    UpstreamConfig, WaveSignal, WaveSnapshot, WindowReport,
};

use super::store::{Released, Snapshot};

/// One upstream's in-process gate.
#[derive(Debug)]
pub(crate) struct ProcessGate {
    config: UpstreamConfig,
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    gate: LocalGate,
    /// The weighted turns of the priority classes.
    turns: ClassTurns,
    /// The budgets of the classes with a budget share.
    class_budgets: ClassBudgets,
    /// Since when (ms) each class has had callers asking, for ties.
    asking_since: HashMap<usize, u64>,
}

impl ProcessGate {
    /// The gate of `config`'s upstream, empty, in NORMAL, with its configured budgets.
    pub(crate) fn new(config: &UpstreamConfig) -> Self {
        Self::with_gate(config, LocalGate::with_budgets(config.wave().clone(), config.budgets()), config.budgets())
    }

    /// A gate that starts as `gate`, with class budgets from `budgets` (a fallback's share).
    pub(crate) fn with_gate(config: &UpstreamConfig, gate: LocalGate, budgets: Budgets) -> Self {
        let state = State {
            gate,
            turns: ClassTurns::new(config.classes().len()),
            class_budgets: ClassBudgets::new(config.classes(), budgets),
            asking_since: HashMap::new(),
        };
        Self { config: config.clone(), state: Mutex::new(state) }
    }

    /// One permit for the first of `asks` the choice of class reaches (every ask is one head
    /// of this gate's waiting callers).
    pub(crate) fn acquire(&self, asks: &[Ask], lease_ms: u64, now_ms: u64) -> Option<Decision> {
        let first = asks.first()?;
        let mut state = self.state.lock();
        let state = &mut *state;
        let (ask, by_reserve) = if self.config.classes().is_empty() {
            (first, false)
        } else {
            match self.choose(state, asks, now_ms) {
                Ok(chosen) => chosen,
                Err(wait_ms) => {
                    let in_flight = u32::try_from(state.gate.ledger().len()).unwrap_or(u32::MAX);
                    let reason = DenyReason::AtLimit;
                    return Some(Decision::Denied { id: first.id.clone(), reason, retry_after_ms: wait_ms, in_flight });
                }
            }
        };
        let admission = state.gate.acquire_with(ask.id.as_str(), now_ms, lease_ms, ask.tokens);
        let in_flight = u32::try_from(state.gate.ledger().len()).unwrap_or(u32::MAX);
        Some(match admission {
            Admission::Granted { wave, state: wave_state, limit } => {
                if let Some(class) = self.class_of(&ask.id) {
                    if !by_reserve {
                        state.turns.granted(class, self.config.classes()[class].weight_value().get());
                    }
                    state.class_budgets.charge(class, now_ms, ask.tokens);
                }
                Decision::Granted { id: ask.id.clone(), wave, state: wave_state, limit, in_flight }
            }
            Admission::Denied { reason, retry_after_ms } => {
                Decision::Denied { id: ask.id.clone(), reason, retry_after_ms, in_flight }
            }
        })
    }

    /// The class of `id`: the class it names, or the default one.
    fn class_of(&self, id: &PermitId) -> Option<usize> {
        if self.config.classes().is_empty() {
            return None;
        }
        Some(id.class().and_then(|name| self.config.class_index(name)).unwrap_or(self.config.default_class()))
    }

    /// The ask the choice of class reaches, and whether through its class's reserve; or, when
    /// none is reached, how long until one may be (0: a release).
    fn choose<'a>(&self, state: &mut State, asks: &'a [Ask], now_ms: u64) -> Result<(&'a Ask, bool), u64> {
        let classes = self.config.classes();
        let limit = state.gate.machine().snapshot().limit;
        let mut views: Vec<ClassView> = classes
            .iter()
            .map(|class| ClassView {
                weight: class.weight_value().get(),
                reserved: class.reserved_at(limit),
                in_flight: 0,
                demand: 0,
                since_ms: 0,
                pass: 0,
            })
            .collect();
        for (id, _) in state.gate.ledger().iter() {
            let class =
                PermitId::parse(id).ok().and_then(|id| self.class_of(&id)).unwrap_or(self.config.default_class());
            if let Some(view) = views.get_mut(class) {
                view.in_flight += 1;
            }
        }
        let mut asking: Vec<usize> = Vec::new();
        for ask in asks {
            let Some(class) = self.class_of(&ask.id) else { continue };
            let view = &mut views[class];
            view.demand = view.demand.saturating_add(ask.waiting.max(1));
            asking.push(class);
        }
        state.asking_since.retain(|class, _| asking.contains(class));
        for &class in &asking {
            views[class].since_ms = *state.asking_since.entry(class).or_insert(now_ms);
        }
        // A class whose own budget has nothing left takes no part; if that leaves none, ask
        // again when the first of them has.
        let mut capped_wait: Option<u64> = None;
        for ask in asks {
            let Some(class) = self.class_of(&ask.id) else { continue };
            if views[class].demand > 0
                && let Some(wait) = state.class_budgets.wait_ms(class, now_ms, ask.tokens)
            {
                views[class].demand = 0;
                capped_wait = Some(capped_wait.map_or(wait, |w| w.min(wait)));
            }
        }
        state.turns.observe(&mut views);
        let Some(class) = next_class(&views) else { return Err(capped_wait.unwrap_or(0)) };
        let by_reserve = wavegate_core::priority::by_reserve(&views[class]);
        asks.iter().find(|ask| self.class_of(&ask.id) == Some(class)).map(|ask| (ask, by_reserve)).ok_or(0)
    }

    /// Releases `id` with its outcome for `wave`, settling `token_delta` tokens.
    pub(crate) fn release(
        &self,
        id: &PermitId,
        wave: u64,
        signal: WaveSignal,
        token_delta: i64,
        now_ms: u64,
    ) -> Released {
        let mut state = self.state.lock();
        state.gate.settle_tokens(token_delta, now_ms);
        if token_delta != 0
            && let Some(class) = self.class_of(id)
        {
            state.class_budgets.settle(class, token_delta, now_ms);
        }
        let report = state.gate.finish(id.as_str(), wave, signal, now_ms);
        let after = snapshot(state.gate.machine().snapshot(), state.gate.ledger().len(), now_ms);
        Released { held: report.held, rate_limit: report.rate_limit, after }
    }

    /// Extends the leases of `ids`; returns those that were no longer held (registered again).
    pub(crate) fn renew(&self, ids: &[PermitId], now_ms: u64, lease_ms: u64) -> Vec<PermitId> {
        let mut state = self.state.lock();
        let _ = state.gate.status(now_ms); // purges the leases that ended
        let again: Vec<PermitId> =
            ids.iter().filter(|id| state.gate.ledger().get(id.as_str()).is_none()).cloned().collect();
        state.gate.renew(ids.iter().map(PermitId::as_str), now_ms, lease_ms);
        again
    }

    /// Takes in what a response to `id` said is left of the provider's windows.
    pub(crate) fn report_window(&self, id: &PermitId, report: WindowReport, now_ms: u64, tokens_each: u64) {
        self.state.lock().gate.report_window(id.as_str(), report, now_ms, tokens_each);
    }

    /// The wave state and the permits held.
    pub(crate) fn snapshot(&self, now_ms: u64) -> Snapshot {
        let mut state = self.state.lock();
        let (wave, held) = state.gate.status(now_ms);
        snapshot(wave, held, now_ms)
    }

    /// What is left of the budgets in force, and the limits learned.
    pub(crate) fn budgets(&self, now_ms: u64) -> (Budgets, BudgetStatus, LearnedBudgets) {
        let state = self.state.lock();
        (state.gate.budgets(now_ms), state.gate.budget_status(now_ms), state.gate.learned(now_ms))
    }

    /// The configured budgets of this gate (a fallback's share of them).
    pub(crate) fn configured(&self) -> Budgets {
        self.state.lock().gate.configured()
    }

    /// The tokens burst in force, if there is a tokens budget.
    pub(crate) fn tokens_burst(&self, now_ms: u64) -> Option<u64> {
        self.state.lock().gate.tokens_burst(now_ms)
    }

    /// What the provider said is left of its windows, as kept here.
    pub(crate) fn provider_windows(&self) -> ProviderWindows {
        self.state.lock().gate.provider_windows()
    }

    /// The wave machine's state (for a fallback to start from).
    pub(crate) fn wave(&self) -> WaveSnapshot {
        self.state.lock().gate.machine().snapshot()
    }

    /// The configured base limit (a fallback's share).
    pub(crate) fn base_limit(&self) -> u32 {
        self.state.lock().gate.machine().config().base_limit.get()
    }
}

/// A wave snapshot and the permits held, as a gate answers.
fn snapshot(wave: WaveSnapshot, held: usize, now_ms: u64) -> Snapshot {
    Snapshot {
        state: wave.state,
        limit: wave.limit,
        wave: wave.wave,
        cooldown_remaining: std::time::Duration::from_millis(wave.cooldown_until_ms.saturating_sub(now_ms)),
        in_flight: u32::try_from(held).unwrap_or(u32::MAX),
    }
}

/// What a fallback starts from: what this process last saw of the shared state.
#[derive(Debug, Clone, Default)]
pub(crate) struct FallbackStart {
    /// How many processes share the limit (live at the last heartbeat), if known.
    pub(crate) live: Option<u32>,
    /// The rest of a shared cooldown in force, if one was seen.
    pub(crate) cooldown_remaining: Option<std::time::Duration>,
    /// The last shared state and limit seen, if any.
    pub(crate) state: Option<(wavegate_core::WaveState, u32)>,
    /// The last shared wave seen (0: none).
    pub(crate) wave: u64,
    /// The limits the provider announced, as this process heard them.
    pub(crate) learned: LearnedBudgets,
    /// This process's grants (when in ms, tokens) over the last minute.
    pub(crate) recent_grants: Vec<(u64, u64)>,
}

impl ProcessGate {
    /// The gate of a fallback: this process's fair share of the limit and of the budgets (the
    /// configured ones and those learned), its recent grants charged, a shared cooldown or
    /// recovery in force carried on; each permit of `held` (id, wave) adopted, its wave turned
    /// into this gate's numbering. Returns the gate, its share, and its wave at the start.
    pub(crate) fn fallback(
        config: &UpstreamConfig,
        start: &FallbackStart,
        held: &mut [(PermitId, u64)],
        now_ms: u64,
    ) -> (Self, u32, u64) {
        use std::num::NonZeroU32;
        use wavegate_core::{WaveState, duration_ms};
        let base = config.limit().get();
        // Until a heartbeat has told how many processes share the limit, assume the worst: as
        // many as the limit, so each takes one (or the configured fallback limit).
        let (share, processes) = match start.live {
            Some(live) => (config.fallback_share(live), live),
            None => (config.fallback_limit().unwrap_or(NonZeroU32::MIN), base),
        };
        let mut wave = config.wave().clone();
        wave.base_limit = share;
        let budgets = config.budgets().share(processes);
        // The limits the provider announced go on here, this process's share of them.
        let mut gate = LocalGate::with_budgets(wave, budgets).with_learned(start.learned, processes);
        // What this process used lately is charged to its share, as it happened: a switch (or
        // a flapping store) does not hand out a fresh burst.
        for (at_ms, tokens) in &start.recent_grants {
            gate.charge(1, *tokens, *at_ms);
        }
        let mut snapshot = gate.machine().snapshot();
        if let Some(rest) = start.cooldown_remaining {
            // A shared cooldown in force goes on here.
            snapshot.state = WaveState::Cooldown;
            snapshot.limit = (share.get() / 2).max(1);
            snapshot.threshold = snapshot.limit;
            snapshot.cooldown_until_ms = now_ms + duration_ms(rest);
            gate.machine_mut().restore(snapshot);
        } else if let Some((state @ (WaveState::Probe | WaveState::Degraded), limit)) = start.state {
            // A recovery in progress goes on here, at this process's share of its limit.
            snapshot.state = state;
            snapshot.limit = (u64::from(limit) * u64::from(share.get()) / u64::from(base)).max(1) as u32;
            gate.machine_mut().restore(snapshot);
        }
        let lease_ms = duration_ms(config.permit_ttl());
        for (id, wave) in held.iter_mut() {
            let local = gate.adopt(id.as_str(), now_ms, lease_ms);
            // A permit of an older shared wave stays older: its 429 is late here too.
            *wave = if *wave < start.wave { local.saturating_sub(1) } else { local };
        }
        let entry_wave = gate.machine().snapshot().wave;
        (Self::with_gate(config, gate, budgets), share.get(), entry_wave)
    }

    /// The gate after a fallback, back in shared mode: empty, the configured budgets, what the
    /// provider announced kept.
    pub(crate) fn after_fallback(config: &UpstreamConfig, learned: LearnedBudgets) -> Self {
        let gate = LocalGate::with_budgets(config.wave().clone(), config.budgets()).with_learned(learned, 1);
        Self::with_gate(config, gate, config.budgets())
    }
}
