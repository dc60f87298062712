//! The in-process twin of the Redis scripts: permits plus the wave machine for one upstream.
//!
//! [`LocalGate`] answers the same four questions as the Lua scripts do in shared mode:
//! acquire a permit by id, finish it with an outcome (release + report), renew leases and read
//! the status. Local mode and the Redis-outage fallback run it; the spec tables in
//! [`spec`](crate::spec) check that it and the scripts agree.
//!
//! ```
//! use std::num::NonZeroU32;
//! use wavegate_core::{Admission, LocalGate, WaveConfig, WaveSignal};
//!
//! let mut gate = LocalGate::new(WaveConfig::new(NonZeroU32::new(1).unwrap()));
//! let first = gate.acquire("a", 0, 30_000);
//! assert!(matches!(first, Admission::Granted { .. }));
//! assert_eq!(gate.acquire("a", 0, 30_000), first); // a resent acquire: still one permit
//! assert!(matches!(gate.acquire("b", 0, 30_000), Admission::Denied { .. }));
//! let Admission::Granted { wave, .. } = first else { unreachable!() };
//! assert!(gate.finish("a", wave, WaveSignal::Success, 10).held);
//! assert!(!gate.finish("a", wave, WaveSignal::Success, 10).held); // idempotent
//! ```

use std::time::Duration;

use crate::gcra::{Budgets, Gcra};
use crate::learned_limit::LearnedBudgets;
use crate::ledger::{HeldPermit, PermitLedger};
use crate::provider_window::{ProviderWindows, WindowReport};
use crate::wave::{
    Admission, DenyReason, RateLimitEffect, Transition, WaveConfig, WaveMachine, WaveSnapshot, WaveState,
};

/// What a finished call tells the wave machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaveSignal {
    /// The call succeeded: counts towards recovery.
    Success,
    /// The provider answered 429, with its `Retry-After` if it gave a usable one.
    RateLimited {
        /// The provider's requested delay.
        retry_after: Option<Duration>,
    },
    /// Anything else (5xx, timeouts, client errors, cancellation): not a wave matter.
    Neutral,
}

/// What [`LocalGate::finish`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FinishReport {
    /// Whether the permit was still held (false for an unknown or expired id).
    pub held: bool,
    /// The effect of a 429 on the wave, if the signal was one.
    pub rate_limit: Option<RateLimitEffect>,
    /// A state change caused by a success, if any.
    pub transition: Option<Transition>,
}

/// What is left of an upstream's rate budgets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct BudgetStatus {
    /// Requests available now and milliseconds until one more is, if there is a budget.
    pub requests: Option<(u64, u64)>,
    /// Tokens available now and milliseconds until one more is, if there is a budget.
    pub tokens: Option<(u64, u64)>,
}

impl BudgetStatus {
    /// What is left of the requests and the tokens budgets (available now, milliseconds until
    /// one more is), each if there is one.
    pub const fn new(requests: Option<(u64, u64)>, tokens: Option<(u64, u64)>) -> Self {
        Self { requests, tokens }
    }
}

/// One upstream's permits, wave state and rate budgets, in process.
#[derive(Debug, Clone)]
pub struct LocalGate {
    machine: WaveMachine,
    ledger: PermitLedger,
    /// The configured budgets (this process's share of them in a fallback).
    configured: Budgets,
    /// The budgets' theoretical arrival times (µs); kept whichever budget is in force.
    requests_tat: u64,
    tokens_tat: u64,
    /// The limits the provider announced, kept for a few of their windows.
    learned: LearnedBudgets,
    /// How many processes the learned limits are shared among here (1 but in a fallback).
    learned_share: u32,
    /// What the provider said is left of its windows.
    windows: ProviderWindows,
}

impl LocalGate {
    /// An empty gate in NORMAL, without rate budgets.
    pub fn new(config: WaveConfig) -> Self {
        Self::with_budgets(config, Budgets::default())
    }

    /// An empty gate in NORMAL with rate budgets, full.
    pub fn with_budgets(config: WaveConfig, budgets: Budgets) -> Self {
        Self {
            machine: WaveMachine::new(config),
            ledger: PermitLedger::new(),
            configured: budgets,
            requests_tat: 0,
            tokens_tat: 0,
            learned: LearnedBudgets::default(),
            learned_share: 1,
            windows: ProviderWindows::default(),
        }
    }

    /// Starts knowing the limits `learned` (e.g. another gate's, at a change of mode), this
    /// gate holding `1 / share` of the fleet's budgets: the learned budgets are divided as
    /// the configured ones were ([`Budgets::share`]), those learned later too.
    pub fn with_learned(mut self, learned: LearnedBudgets, share: u32) -> Self {
        self.learned = learned;
        self.learned_share = share.max(1);
        self
    }

    /// The budgets in force at `now_ms`: the configured ones tightened by the learned limits.
    pub fn budgets(&self, now_ms: u64) -> Budgets {
        self.learned.effective(self.configured, now_ms, self.learned_share)
    }

    /// The configured budgets (in a fallback: this process's share of them), without what is
    /// learned.
    pub fn configured(&self) -> Budgets {
        self.configured
    }

    /// The learned limits kept at `now_ms` (undivided, as the provider said them).
    pub fn learned(&self, now_ms: u64) -> LearnedBudgets {
        self.learned.in_force(now_ms)
    }

    /// Asks for the permit `id` with a lease of `lease_ms` (no token estimate).
    pub fn acquire(&mut self, id: &str, now_ms: u64, lease_ms: u64) -> Admission {
        self.acquire_with(id, now_ms, lease_ms, 0)
    }

    /// Asks for the permit `id` with a lease of `lease_ms`, reserving `tokens` of the tokens
    /// budget. An estimate larger than the tokens burst is refused first (it can never fit);
    /// then the wave and the limit are checked, then the budgets: a request is admitted only
    /// if all of them have room, and then all are charged together.
    ///
    /// An id already held is granted again in its own wave (its lease extended, nothing
    /// charged again), so a resent acquire never creates a second permit.
    pub fn acquire_with(&mut self, id: &str, now_ms: u64, lease_ms: u64, tokens: u64) -> Admission {
        self.ledger.purge_expired(now_ms);
        self.machine.poll(now_ms);
        let expires_ms = now_ms.saturating_add(lease_ms);
        if let Some(held) = self.ledger.get(id) {
            self.ledger.renew(id, expires_ms);
            let s = self.machine.snapshot();
            return Admission::Granted { wave: held.wave, state: s.state, limit: s.limit };
        }
        let budgets = self.budgets(now_ms);
        let (requests_gcra, tokens_gcra) = (budgets.requests.map(Gcra::new), budgets.tokens.map(Gcra::new));
        // Never fits: refused before the wave and the limit, so it is not told to wait.
        if tokens_gcra.is_some_and(|g| !g.fits_ever(tokens)) {
            return Admission::Denied { reason: DenyReason::TokensExceedBurst, retry_after_ms: 0 };
        }
        let in_flight = u32::try_from(self.ledger.len()).unwrap_or(u32::MAX);
        let admission = self.machine.admit(now_ms, in_flight);
        let Admission::Granted { wave, .. } = admission else { return admission };
        if let Some(wait) = self.windows.wait_ms(now_ms, tokens) {
            return Admission::Denied { reason: DenyReason::ProviderWindow, retry_after_ms: wait };
        }
        let estimate = tokens;
        let now_us = now_ms.saturating_mul(1000);
        let requests = requests_gcra.map(|g| g.check(self.requests_tat, now_us, 1)).transpose();
        let tokens = tokens_gcra.map(|g| g.check(self.tokens_tat, now_us, tokens)).transpose();
        match (requests, tokens) {
            (Ok(requests_tat), Ok(tokens_tat)) => {
                if let Some(tat) = requests_tat {
                    self.requests_tat = tat;
                }
                if let Some(tat) = tokens_tat {
                    self.tokens_tat = tat;
                }
                self.ledger.insert(id, HeldPermit { expires_ms, wave });
                self.windows.charge(now_ms, estimate);
                admission
            }
            (requests, tokens) => {
                let (requests_wait, tokens_wait) = (requests.err().unwrap_or(0), tokens.err().unwrap_or(0));
                let reason =
                    if requests_wait >= tokens_wait { DenyReason::RequestBudget } else { DenyReason::TokenBudget };
                Admission::Denied { reason, retry_after_ms: requests_wait.max(tokens_wait) }
            }
        }
    }

    /// Takes in what a response to permit `id` said is left of the provider's windows: the
    /// other permits held are the calls the provider may not have counted yet, each assumed to
    /// reserve `tokens_each` tokens (see [`ProviderWindows::report`]). `id` itself is not
    /// counted, whether it is still held or already finished. The limits it announced are
    /// learned ([`LearnedBudgets::report`]).
    pub fn report_window(&mut self, id: &str, report: WindowReport, now_ms: u64, tokens_each: u64) {
        self.ledger.purge_expired(now_ms);
        let held = self.ledger.len() - usize::from(self.ledger.get(id).is_some());
        let others = u32::try_from(held).unwrap_or(u32::MAX);
        self.windows.report(report, now_ms, others, tokens_each);
        self.learned.report(report.limits, now_ms);
    }

    /// What the provider said is left of its windows, as kept here.
    pub fn provider_windows(&self) -> ProviderWindows {
        self.windows
    }

    /// Settles a token reservation: `delta` more tokens (negative: fewer) were used than
    /// reserved at acquire.
    pub fn settle_tokens(&mut self, delta: i64, now_ms: u64) {
        if let Some(budget) = self.budgets(now_ms).tokens {
            self.tokens_tat = Gcra::new(budget).settle(self.tokens_tat, now_ms.saturating_mul(1000), delta);
        }
    }

    /// Charges usage counted elsewhere (e.g. while another gate was in charge) to the budgets.
    pub fn charge(&mut self, requests: u64, tokens: u64, now_ms: u64) {
        let now_us = now_ms.saturating_mul(1000);
        let budgets = self.budgets(now_ms);
        if let Some(budget) = budgets.requests {
            self.requests_tat = Gcra::new(budget).charge(self.requests_tat, now_us, requests);
        }
        if let Some(budget) = budgets.tokens {
            self.tokens_tat = Gcra::new(budget).charge(self.tokens_tat, now_us, tokens);
        }
    }

    /// The tokens budget's burst in force at `now_ms` (the largest estimate that can fit), if
    /// there is a tokens budget.
    pub fn tokens_burst(&self, now_ms: u64) -> Option<u64> {
        self.budgets(now_ms).tokens.map(|b| u64::from(b.burst()))
    }

    /// What is left of the rate budgets in force now.
    pub fn budget_status(&self, now_ms: u64) -> BudgetStatus {
        let now_us = now_ms.saturating_mul(1000);
        let budgets = self.budgets(now_ms);
        BudgetStatus {
            requests: budgets.requests.map(|b| Gcra::new(b).remaining(self.requests_tat, now_us)),
            tokens: budgets.tokens.map(|b| Gcra::new(b).remaining(self.tokens_tat, now_us)),
        }
    }

    /// Takes over a permit whose call is already running (e.g. one granted by the shared store
    /// before an outage): it counts against the limit from now on, without an admission
    /// check. Returns the wave its outcome is reported against: the current wave in NORMAL;
    /// otherwise the one before, since a call older than the last cut says nothing new (its
    /// 429 is late, its success does not count towards recovery).
    pub fn adopt(&mut self, id: &str, now_ms: u64, lease_ms: u64) -> u64 {
        self.ledger.purge_expired(now_ms);
        self.machine.poll(now_ms);
        let snapshot = self.machine.snapshot();
        let wave = if snapshot.state == WaveState::Normal { snapshot.wave } else { snapshot.wave - 1 };
        self.ledger.insert(id, HeldPermit { expires_ms: now_ms.saturating_add(lease_ms), wave });
        wave
    }

    /// Reports the outcome of permit `id` (issued in `wave`) and releases it.
    ///
    /// The report counts even when the permit's lease already ended (`held` is then false):
    /// a 429 is news about the wave whoever holds the permit.
    pub fn finish(&mut self, id: &str, wave: u64, signal: WaveSignal, now_ms: u64) -> FinishReport {
        self.ledger.purge_expired(now_ms);
        self.machine.poll(now_ms);
        let (rate_limit, transition) = match signal {
            WaveSignal::Success => {
                let in_flight = u32::try_from(self.ledger.len()).unwrap_or(u32::MAX);
                (None, self.machine.on_success(wave, in_flight, now_ms))
            }
            WaveSignal::RateLimited { retry_after } => {
                (Some(self.machine.on_rate_limited(wave, now_ms, retry_after)), None)
            }
            WaveSignal::Neutral => (None, None),
        };
        let held = self.ledger.remove(id).is_some();
        FinishReport { held, rate_limit, transition }
    }

    /// Extends the leases of permits whose calls are still running; returns how many were no
    /// longer held and were registered again (their lease had ended, or the store lost them):
    /// a running call counts against the limit whatever happened to its registration.
    pub fn renew<'a>(&mut self, ids: impl IntoIterator<Item = &'a str>, now_ms: u64, lease_ms: u64) -> usize {
        self.ledger.purge_expired(now_ms);
        let expires_ms = now_ms.saturating_add(lease_ms);
        let mut registered_again = 0;
        for id in ids {
            if !self.ledger.renew(id, expires_ms) {
                self.adopt(id, now_ms, lease_ms);
                registered_again += 1;
            }
        }
        registered_again
    }

    /// The wave state and the number of permits held now.
    pub fn status(&mut self, now_ms: u64) -> (WaveSnapshot, usize) {
        self.ledger.purge_expired(now_ms);
        self.machine.poll(now_ms);
        (self.machine.snapshot(), self.ledger.len())
    }

    /// The wave machine, e.g. to carry its state across a change of mode.
    pub fn machine(&self) -> &WaveMachine {
        &self.machine
    }

    /// The wave machine, mutable, e.g. to [`restore`](WaveMachine::restore) a snapshot.
    pub fn machine_mut(&mut self) -> &mut WaveMachine {
        &mut self.machine
    }

    /// The held permits.
    pub fn ledger(&self) -> &PermitLedger {
        &self.ledger
    }
}
