//! The in-process twin of the Redis scripts: permits, the wave machine, rate budgets,
//! priority classes and the waiting list of one upstream.
//!
//! [`LocalGate`] answers the same questions as the Lua scripts do in shared mode, with the
//! same rules: [`acquire`](LocalGate::acquire) is `lua/acquire.lua` as a whole (purge, time,
//! an id already held granted again, a never-fitting estimate refused, the wave, the
//! fleet-wide choice of class and tenant among every instance waiting at this gate, the
//! provider's windows, the budgets, the charges), [`finish`](LocalGate::finish) is
//! `lua/finish.lua` (release, report, settle, and which instance to wake),
//! [`renew`](LocalGate::renew), [`report_window`](LocalGate::report_window) and
//! [`status_with_classes`](LocalGate::status_with_classes) the others. Local mode and the
//! Redis-outage fallback run it; several schedulers of one process may share one gate, each an
//! [`Instance`] at it, as a fleet shares Redis. Time is the caller's (a monotonic clock).
//! The spec tables in `wavegate_core::spec` (the `spec` feature) run both twins.
//!
//! ```
//! use std::num::NonZeroU32;
//! use wavegate_core::{Ask, Decision, Instance, LocalGate, PermitId, WaveConfig, WaveSignal};
//!
//! let mut gate = LocalGate::new(WaveConfig::new(NonZeroU32::new(1).unwrap()));
//! let (alpha, beta) = (Instance::new("alpha").unwrap(), Instance::new("beta").unwrap());
//! let ask = |instance: &Instance, n| Ask { id: PermitId::new(None, instance, n, None), tokens: 0, output: 0, waiting: 1 };
//! let first = gate.acquire(&alpha, &[ask(&alpha, 1)], 30_000, 0);
//! assert!(first.is_granted());
//! assert_eq!(gate.acquire(&alpha, &[ask(&alpha, 1)], 30_000, 0), first); // sent again: still one permit
//! let Decision::Denied { id, .. } = gate.acquire(&beta, &[ask(&beta, 1)], 30_000, 5) else { unreachable!() };
//! assert_eq!(id, ask(&beta, 1).id); // a denial names the ask it answers
//! let Decision::Granted { wave, id, .. } = first else { unreachable!() };
//! let report = gate.finish(&id, wave, WaveSignal::Success, 0, 10);
//! assert!(report.held);
//! assert_eq!(report.wake, Some(beta)); // the release wakes the instance that waits
//! assert!(!gate.finish(&id, wave, WaveSignal::Success, 0, 10).held); // idempotent
//! ```

use std::collections::HashMap;
use std::time::Duration;

use crate::ask::{Ask, Decision};
use crate::budget_turn::BudgetTurn;
use crate::class_budget::ClassBudgets;
use crate::clock::duration_ms;
use crate::config::UpstreamConfig;
use crate::gcra::{Budgets, Gcra, RateBudget};
use crate::learned_limit::LearnedBudgets;
use crate::ledger::{HeldPermit, PermitLedger};
use crate::outage_usage::OutageUsage;
use crate::permit_id::text::{class_of, member_instance, tenant_of};
use crate::permit_id::{Instance, PermitId};
use crate::priority::{ClassTurns, PriorityClass};
use crate::provider_window::{ProviderWindows, WindowReport};
use crate::served_spans::{ServedSpan, ServedSpans};
use crate::token_delta::{TokenDelta, WindowsBack};
use crate::wave::{
    Admission, DenyReason, RateLimitEffect, Transition, WaveConfig, WaveMachine, WaveSnapshot, WaveState,
};

mod day;
mod fallback;
mod fleet;
mod proof;
mod split;
mod waiting;

pub use fallback::{DayLeft, Fallback, FallbackStart, LastShared};
use fleet::{Head, member};
use waiting::{Offers, WaitingHead, WaitingList};
pub use waiting::{PRIORITY_FRESH_MS, WAITING_TTL_MS};

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
    /// The call succeeded while the provider served at most `at_most` calls at once: counts
    /// towards recovery as a success with no more than that many permits in flight (shadow
    /// mode, where the permits held are ghosts', and what the provider served is known
    /// otherwise: a limit is taken for one that held only when the provider served it). The
    /// Lua twin's outcome is `served:<at_most>` (`finish.lua`), or
    /// `served:<at_most>:<went>:<ended>` with a span (Unix ms).
    ServedSuccess {
        /// The most calls the provider is known to have served at once while this one ran,
        /// as its process saw them.
        at_most: u32,
        /// When the call ran, to count the other processes' served calls beside it: the
        /// gate keeps the fleet's recent ones ([`ServedSpans`], recorded as each ended:
        /// [`Went`](Self::Went)) and takes the larger count. `None` when the process
        /// alone calls the provider.
        span: Option<ServedSpan>,
    },
    /// A call in shadow at the provider over `span`, in a fleet, `served` or not (refused,
    /// failed), recorded as it ended for the fleet's counts ([`ServedSpans`]); nothing to
    /// learn by itself, and the id (the call's pass's) is not held. The Lua twin's outcome is
    /// `went:<s|r>:<went>:<ended>`.
    Went {
        /// When the call was at the provider.
        span: ServedSpan,
        /// Whether the provider served it.
        served: bool,
    },
    /// A 429 of a call in shadow, in a fleet, reported once the calls served beside it have
    /// ended: the limit's to learn from (as [`RateLimited`](Self::RateLimited)) only when the
    /// fleet's recent calls ([`ServedSpans::met`]) show no more calls at the provider at once
    /// while it ran, itself included, than the limit lets through — enforcing would have met
    /// it; with more, it is the extra calls' doing, and nothing to learn (as
    /// [`Neutral`](Self::Neutral)). The Lua twin's outcome is
    /// `rate_limited_among:<went>:<ended>` (`finish.lua`).
    RateLimitedAmong {
        /// The provider's requested delay.
        retry_after: Option<Duration>,
        /// When the call was at the provider.
        span: ServedSpan,
    },
}

impl WaveSignal {
    /// The `Retry-After` of a 429 (either kind), `None` for any other signal.
    pub fn rate_limited(self) -> Option<Option<Duration>> {
        match self {
            WaveSignal::RateLimited { retry_after } | WaveSignal::RateLimitedAmong { retry_after, .. } => {
                Some(retry_after)
            }
            _ => None,
        }
    }

    /// The signal with its span, if any, moved from a clock that reads `from_now_ms` to one
    /// that reads `to_now_ms` at the same instant ([`ServedSpan::moved`]: a process's clock to
    /// the store's).
    pub fn with_span_moved(self, from_now_ms: u64, to_now_ms: u64) -> Self {
        let moved = |span: ServedSpan| span.moved(from_now_ms, to_now_ms);
        match self {
            WaveSignal::ServedSuccess { at_most, span } => WaveSignal::ServedSuccess { at_most, span: span.map(moved) },
            WaveSignal::Went { span, served } => WaveSignal::Went { span: moved(span), served },
            WaveSignal::RateLimitedAmong { retry_after, span } => {
                WaveSignal::RateLimitedAmong { retry_after, span: moved(span) }
            }
            signal => signal,
        }
    }
}

/// The longest lease a handed permit gets (a day): `lua/finish.lua` clamps the lease it reads
/// back to it.
const HANDED_LEASE_MAX_MS: u64 = 86_400_000;

/// What [`LocalGate::finish`] did (the twin of `lua/finish.lua`'s reply).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FinishReport {
    /// Whether the permit was still held (false for an unknown or expired id).
    pub held: bool,
    /// The effect of a 429 on the wave, if the signal was one.
    pub rate_limit: Option<RateLimitEffect>,
    /// A state change caused by a success, if any.
    pub transition: Option<Transition>,
    /// The wave state after it.
    pub after: WaveSnapshot,
    /// Permits held after it.
    pub in_flight: u32,
    /// The instance to wake for the freed permit: with classes the one the fleet-wide choice
    /// reaches, else the one that has waited longest (taken off the list); `None` when the id
    /// was not held or nobody waits. Members that have not asked for [`WAITING_TTL_MS`] are
    /// dropped first.
    pub wake: Option<Instance>,
    /// The permit granted to the woken instance in the same step (the hand-off), and the
    /// wave it was granted in: without classes, the freed permit goes to the ask the woken
    /// instance last made at the limit, when the wave, the provider's windows and the budgets'
    /// turn admit it and no rate or day budget is in force ([`LocalGate::finish`]).
    pub handed: Option<(PermitId, u64)>,
}

/// What is left of an upstream's rate budgets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct BudgetStatus {
    /// Requests available now and milliseconds until one more is, if there is a budget.
    pub requests: Option<(u64, u64)>,
    /// Tokens available now and milliseconds until one more is, if there is a budget.
    pub tokens: Option<(u64, u64)>,
    /// Input tokens available now and milliseconds until one more is, if there is a budget.
    pub input: Option<(u64, u64)>,
    /// Output tokens available now and milliseconds until one more is, if there is a budget.
    pub output: Option<(u64, u64)>,
    /// Requests per day available now and milliseconds until one more is, if there is a
    /// budget.
    pub requests_per_day: Option<(u64, u64)>,
    /// Tokens per day available now and milliseconds until one more is, if there is a budget.
    pub tokens_per_day: Option<(u64, u64)>,
}

impl BudgetStatus {
    /// What is left of the requests and the tokens budgets (available now, milliseconds until
    /// one more is), each if there is one.
    pub const fn new(requests: Option<(u64, u64)>, tokens: Option<(u64, u64)>) -> Self {
        Self { requests, tokens, input: None, output: None, requests_per_day: None, tokens_per_day: None }
    }

    /// The same, with what is left of the input and the output tokens budgets.
    pub const fn with_split(self, input: Option<(u64, u64)>, output: Option<(u64, u64)>) -> Self {
        Self { input, output, ..self }
    }

    /// The same, with what is left of the requests and the tokens per day budgets.
    pub const fn with_day(self, requests: Option<(u64, u64)>, tokens: Option<(u64, u64)>) -> Self {
        Self { requests_per_day: requests, tokens_per_day: tokens, ..self }
    }
}

/// One upstream's permits, wave state, rate budgets, classes and waiting list, in process.
#[derive(Debug, Clone)]
pub struct LocalGate {
    machine: WaveMachine,
    ledger: PermitLedger,
    /// The configured budgets (this process's share of them in a fallback).
    configured: Budgets,
    /// In a fallback, the fleet's configured budgets, of which `configured` is this process's
    /// share: the largest estimate that fits is the fleet's, taken in debt above the share's
    /// burst ([`with_fleet_budgets`](Self::with_fleet_budgets)).
    fleet: Option<Budgets>,
    /// The budgets' theoretical arrival times (µs); kept whichever budget is in force.
    requests_tat: u64,
    tokens_tat: u64,
    /// The input and the output tokens budgets' TATs (µs).
    input_tat: u64,
    output_tat: u64,
    /// The requests and the tokens per day budgets' TATs (µs).
    requests_day_tat: u64,
    tokens_day_tat: u64,
    /// The limits the provider announced, kept for a few of their windows.
    learned: LearnedBudgets,
    /// How many processes the learned limits are shared among here (1 but in a fallback).
    learned_share: u32,
    /// What the provider said is left of its windows.
    windows: ProviderWindows,
    /// The turn at the budgets' next room (`lua/budget_turn.lua`).
    turn: BudgetTurn,
    /// The priority classes, in configured order (none: no choice of class).
    classes: Vec<PriorityClass>,
    /// The class that takes permits whose id names no known class.
    default_class: usize,
    /// A permit in the three-field form counts in its class's share only while its lease ends
    /// at least this far ahead (ms; 0: always).
    class_window_ms: u64,
    /// The classes' weighted turns.
    turns: ClassTurns,
    /// The classes' own budgets (a share of the configured ones).
    class_budgets: ClassBudgets,
    /// The instances waiting at the limit.
    waiting: WaitingList,
    /// The recent calls the provider served, of every member (shadow mode).
    served: ServedSpans,
}

impl LocalGate {
    /// An empty gate in NORMAL, without rate budgets or classes.
    pub fn new(config: WaveConfig) -> Self {
        Self::with_budgets(config, Budgets::default())
    }

    /// An empty gate in NORMAL with rate budgets, full, without classes.
    pub fn with_budgets(config: WaveConfig, budgets: Budgets) -> Self {
        Self {
            machine: WaveMachine::new(config),
            ledger: PermitLedger::new(),
            configured: budgets,
            fleet: None,
            requests_tat: 0,
            tokens_tat: 0,
            input_tat: 0,
            output_tat: 0,
            requests_day_tat: 0,
            tokens_day_tat: 0,
            learned: LearnedBudgets::default(),
            learned_share: 1,
            windows: ProviderWindows::default(),
            turn: BudgetTurn::default(),
            classes: Vec::new(),
            default_class: 0,
            class_window_ms: 0,
            turns: ClassTurns::default(),
            class_budgets: ClassBudgets::default(),
            waiting: WaitingList::default(),
            served: ServedSpans::default(),
        }
    }

    /// The gate of `config`'s upstream: its wave, its budgets and its classes, as
    /// [`SharedGate`](https://docs.rs/wavegate-redis) is configured for it.
    pub fn for_upstream(config: &UpstreamConfig) -> Self {
        Self::with_budgets(config.wave().clone(), config.budgets()).with_classes(
            config.classes(),
            config.default_class(),
            config.class_count_window(),
        )
    }

    /// Shares the permits among priority `classes` (in configured order; the one at `default`
    /// takes permits whose id names no class) by the fleet-wide choice of
    /// [`acquire`](Self::acquire). A permit counts in its class's share only while its lease
    /// ends at least `count_window` ahead ([`UpstreamConfig::class_count_window`]); zero
    /// counts every permit. The classes' own budgets are their shares of the configured
    /// budgets (call it after those are set). Mirrors `SharedGate::with_classes`.
    pub fn with_classes(mut self, classes: &[PriorityClass], default: usize, count_window: Duration) -> Self {
        self.classes = classes.to_vec();
        self.default_class = if default < classes.len() { default } else { 0 };
        self.class_window_ms = duration_ms(count_window);
        self.turns = ClassTurns::new(classes.len());
        self.class_budgets = ClassBudgets::new(classes);
        if self.fleet.is_some() {
            self.class_budgets = self.class_budgets.in_debt();
        }
        self
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

    /// Takes new configured budgets (a live change of a rate) at `now_ms`: each budget's TAT,
    /// and each capped class's, keeps the units it holds ([`rescale_tat`](crate::rescale_tat));
    /// `rebudget` in `wave.lua` is the Lua twin.
    pub fn set_budgets(&mut self, budgets: Budgets, now_ms: u64) {
        let now_us = now_ms.saturating_mul(1000);
        let from = self.configured;
        let rescale = |tat: u64, f: Option<RateBudget>, t: Option<RateBudget>| match (f, t) {
            (Some(f), Some(t)) => crate::gcra::rescale_tat(tat, now_us, f.per_minute(), t.per_minute()),
            _ => tat,
        };
        self.requests_tat = rescale(self.requests_tat, from.requests, budgets.requests);
        self.tokens_tat = rescale(self.tokens_tat, from.tokens, budgets.tokens);
        self.input_tat = rescale(self.input_tat, from.input, budgets.input);
        self.output_tat = rescale(self.output_tat, from.output, budgets.output);
        let rescale_day = |tat: u64, f: Option<crate::DayBudget>, t: Option<crate::DayBudget>| match (f, t) {
            (Some(f), Some(t)) => crate::gcra::rescale_units(tat, now_us, f.per_day(), t.per_day()),
            _ => tat,
        };
        self.requests_day_tat = rescale_day(self.requests_day_tat, from.requests_per_day, budgets.requests_per_day);
        self.tokens_day_tat = rescale_day(self.tokens_day_tat, from.tokens_per_day, budgets.tokens_per_day);
        self.class_budgets.rescale(from, budgets, now_us);
        self.configured = budgets;
    }

    /// Takes the priority classes' new weights and reserves (a live change): `classes` are
    /// this gate's, by name and order (otherwise nothing changes); the weighted turns and the
    /// classes' budgets stay.
    pub fn set_classes(&mut self, classes: &[PriorityClass]) {
        let same = classes.len() == self.classes.len()
            && classes.iter().zip(&self.classes).all(|(new, old)| new.name() == old.name());
        if same {
            self.classes = classes.to_vec();
        }
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

    /// The priority classes, in configured order (empty without classes).
    pub fn classes(&self) -> &[PriorityClass] {
        &self.classes
    }

    /// Asks for one permit on behalf of `instance`'s waiting callers: one [`Ask`] per head it
    /// offers (one per class, or per tenant within a class), exactly as `lua/acquire.lua`
    /// decides, with `now_ms` from the caller's clock:
    ///
    /// 1. expired leases are purged and a cooldown past its end becomes PROBE;
    /// 2. an ask whose id is held already is granted again in its own wave, its lease
    ///    extended, nothing charged again (a resent acquire never makes a second permit);
    /// 3. **never fits**: the first ask whose estimate is above the tokens burst in force (for
    ///    a class with a budget share, the smaller of it and the class's own burst) is refused
    ///    with [`DenyReason::TokensExceedBurst`], naming it, before anything else and without
    ///    touching the waiting list. It fails only itself: the other heads were not told to
    ///    wait, and the caller asks again at once without it;
    /// 4. the wave: refused in COOLDOWN (with the rest of it) or at the limit;
    /// 5. with classes, the choice: `instance` joins the waiting list with its asks (or, not on
    ///    it yet, joins the choice in memory and is listed only if it still waits), and the
    ///    free permits are handed out one by one across **every instance waiting at this
    ///    gate** — below-reserve classes first, then weighted turns, then the tenant with the
    ///    fewest permits, then the longest wait; a class whose own budget cannot take the
    ///    request takes no part. The first of them to reach one of `instance`'s asks grants
    ///    it; if none does, the first ask is refused [`DenyReason::AtLimit`];
    /// 6. the provider's windows, then the requests and tokens budgets (configured and
    ///    learned): all are charged together (the class's own budgets too), or none.
    ///
    /// Without classes only the first ask counts (a process has one head), and an instance
    /// refused at the limit keeps its place on the waiting list until granted, so a release
    /// wakes the one that waited longest ([`FinishReport::wake`]).
    ///
    /// # Panics
    ///
    /// If `asks` is empty: there is nothing to answer.
    pub fn acquire(&mut self, instance: &Instance, asks: &[Ask], lease_ms: u64, now_ms: u64) -> Decision {
        assert!(!asks.is_empty(), "LocalGate::acquire: nothing to ask for");
        let classed = !self.classes.is_empty();
        let asks = if classed { asks } else { &asks[..1] };
        let default = self.classes.get(self.default_class).map(|c| c.name().to_owned()).unwrap_or_default();
        let heads: Vec<Head<'_>> = asks
            .iter()
            .map(|ask| Head {
                id: ask.id.as_str(),
                class: if classed { ask.id.class().unwrap_or(&default) } else { "" },
                tokens: ask.tokens,
                output: ask.output,
                waiting: ask.waiting,
            })
            .collect();
        let (index, admission, in_flight) = self.acquire_heads(instance.as_str(), &heads, classed, lease_ms, now_ms);
        Decision::new(asks[index].id.clone(), admission, in_flight)
    }

    /// Asks for the permit `id` by its text, without classes, instance or tokens (kept until
    /// the engine moves to [`acquire`](Self::acquire)).
    #[doc(hidden)]
    pub fn acquire_text(&mut self, id: &str, now_ms: u64, lease_ms: u64) -> Admission {
        self.acquire_with(id, now_ms, lease_ms, 0)
    }

    /// Asks for the permit `id` by its text, reserving `tokens`, without classes or instance:
    /// [`acquire`](Self::acquire) with one ask (kept until the engine moves to it).
    #[doc(hidden)]
    pub fn acquire_with(&mut self, id: &str, now_ms: u64, lease_ms: u64, tokens: u64) -> Admission {
        let head = Head { id, class: "", tokens, output: 0, waiting: 1 };
        self.acquire_heads("", &[head], false, lease_ms, now_ms).1
    }

    fn in_flight(&self) -> u32 {
        u32::try_from(self.ledger.len()).unwrap_or(u32::MAX)
    }

    fn class_config(&self) -> fleet::Config<'_> {
        fleet::Config { classes: &self.classes, default: self.default_class, count_window_ms: self.class_window_ms }
    }

    /// `lua/acquire.lua`: which head the answer is for, the answer, and the permits held
    /// after it. `instance` is `''` for none (no waiting list); `classed`: the heads carry
    /// classes (the script's class form).
    fn acquire_heads(
        &mut self,
        instance: &str,
        heads: &[Head<'_>],
        classed: bool,
        lease_ms: u64,
        now_ms: u64,
    ) -> (usize, Admission, u32) {
        let classes = classed && !self.classes.is_empty();
        self.ledger.purge_expired(now_ms);
        self.machine.poll(now_ms);
        let expires_ms = now_ms.saturating_add(lease_ms);
        for (k, head) in heads.iter().enumerate() {
            if let Some(held) = self.ledger.get(head.id) {
                self.ledger.renew(head.id, expires_ms);
                let s = self.machine.snapshot();
                return (k, Admission::Granted { wave: held.wave, state: s.state, limit: s.limit }, self.in_flight());
            }
        }
        let in_flight = self.in_flight();
        let budgets = self.budgets(now_ms);
        // Never fits: refused first, naming the ask, so neither it nor the others are told
        // to wait. In a fallback, against the fleet's burst (above the share's: in debt).
        if let Some(ceiling) = self.tokens_burst(now_ms) {
            for (k, head) in heads.iter().enumerate() {
                let own = classes
                    .then(|| self.class_tokens_burst(self.class_config().index_or_default(Some(head.class)), now_ms))
                    .flatten();
                let burst = tightest_burst(ceiling, own);
                if head.tokens > burst {
                    let denied = Admission::Denied { reason: DenyReason::TokensExceedBurst, retry_after_ms: 0 };
                    return (k, denied, in_flight);
                }
            }
        }
        for (k, head) in heads.iter().enumerate() {
            if self.split_exceeds_burst(split::parts(head.tokens, head.output), now_ms)
                || self.day_exceeds_burst(head.tokens, now_ms)
            {
                let denied = Admission::Denied { reason: DenyReason::TokensExceedBurst, retry_after_ms: 0 };
                return (k, denied, in_flight);
            }
        }
        let mut denial = match self.machine.admit(now_ms, in_flight) {
            Admission::Denied { reason, retry_after_ms } => Some((reason, retry_after_ms)),
            Admission::Granted { .. } => None,
        };
        let limit = self.machine.snapshot().limit;
        let mut answered = 0;
        let mut chosen: Option<(usize, bool)> = None;
        let mut deferred = false;
        if classes && !instance.is_empty() {
            let choosing = denial.is_none();
            if choosing {
                deferred = !self.classes.iter().any(|c| self.waiting.has_asked(&member(c.name(), instance)));
            }
            if !deferred {
                self.register_waiting(instance, heads, now_ms, true);
            }
            if choosing {
                let config = self.class_config();
                let mut asked: HashMap<(usize, &str), usize> = HashMap::new();
                let mut asked_tokens: HashMap<usize, u64> = HashMap::new();
                for (k, head) in heads.iter().enumerate() {
                    let c = config.index_or_default(Some(head.class));
                    asked.insert((c, tenant_of(head.id)), k);
                    let most = asked_tokens.entry(c).or_insert(0);
                    *most = (*most).max(head.tokens);
                }
                let mut fleet = fleet::classes(config, limit, now_ms, true, &self.ledger, &self.waiting);
                if deferred {
                    fleet::add_offers(config, &mut fleet, instance, heads, now_ms);
                }
                fleet::cap(&mut fleet, &self.class_budgets, budgets, now_ms, |c| {
                    asked_tokens.get(&c).copied().unwrap_or(1)
                });
                fleet::observe(&mut self.turns, &mut fleet);
                let room = limit.saturating_sub(in_flight);
                match fleet::choose_grant(&mut fleet, room, |c, tag| asked.get(&(c, tag)).copied()) {
                    Some((k, c, by_reserve)) => {
                        answered = k;
                        chosen = Some((c, by_reserve));
                    }
                    None => denial = Some((DenyReason::AtLimit, 0)),
                }
            }
        }
        let head = heads[answered];
        let window_wait = self.windows.wait_ms(now_ms, head.tokens, head.output);
        let result = if let Some((reason, retry_after_ms)) = denial {
            if reason == DenyReason::AtLimit && !instance.is_empty() && !classes {
                // The place is kept from the first ask; asking again says the process still waits.
                self.waiting.join(instance, now_ms);
                self.waiting.saw(instance, now_ms);
                // What a release may hand it (the last ask replaces an earlier one).
                let (tokens, output) = (head.tokens, head.output);
                self.waiting.set_head(instance, WaitingHead { id: head.id.to_owned(), lease_ms, tokens, output });
            }
            (answered, Admission::Denied { reason, retry_after_ms }, in_flight)
        } else if let Some(wait) = window_wait {
            if !classes {
                self.turn.refused(instance, now_ms, wait);
            }
            (answered, Admission::Denied { reason: DenyReason::ProviderWindow, retry_after_ms: wait }, in_flight)
        } else {
            let now_us = now_ms.saturating_mul(1000);
            let [requests_day, tokens_day] = self.day_check(budgets, head.tokens, now_us);
            let requests = budgets.requests.map(|b| Gcra::new(b).check(self.requests_tat, now_us, 1)).transpose();
            let requests = match (requests, requests_day) {
                (Ok(requests), Ok(day)) => Ok((requests, day)),
                (requests, day) => Err(requests.err().unwrap_or(0).max(day.err().unwrap_or(0))),
            };
            let tokens = budgets
                .tokens
                .map(|b| {
                    let gcra = Gcra::new(b);
                    if self.fleet.is_some() {
                        gcra.check_in_debt(self.tokens_tat, now_us, head.tokens)
                    } else {
                        gcra.check(self.tokens_tat, now_us, head.tokens)
                    }
                })
                .transpose();
            let split = self.split_check(budgets, split::parts(head.tokens, head.output), now_us);
            let tokens = match (tokens, split, tokens_day) {
                (Ok(tokens), Ok(split), Ok(day)) => Ok((tokens, split, day)),
                (tokens, split, day) => {
                    Err(tokens.err().unwrap_or(0).max(split.err().unwrap_or(0)).max(day.err().unwrap_or(0)))
                }
            };
            // Without classes, the turn at the budgets' room; with classes the fleet's choice
            // of class orders the waiters.
            let room = requests.is_ok() && tokens.is_ok();
            let turn_wait = if room && !classes { self.turn.wait_ms(instance, now_ms) } else { None };
            match (requests, tokens, turn_wait) {
                (Ok(_), Ok(_), Some(wait)) => {
                    let denied = Admission::Denied { reason: DenyReason::EarlierWaiter, retry_after_ms: wait };
                    (answered, denied, in_flight)
                }
                (Ok((requests_tat, requests_day_tat)), Ok((tokens_tat, split_tats, tokens_day_tat)), None) => {
                    if !classes {
                        self.turn.granted(instance, now_ms);
                    }
                    if let Some(tat) = requests_tat {
                        self.requests_tat = tat;
                    }
                    if let Some(tat) = tokens_tat {
                        self.tokens_tat = tat;
                    }
                    self.split_charge(split_tats);
                    self.day_charge(requests_day_tat, tokens_day_tat);
                    let s = self.machine.snapshot();
                    if let Some((class, _)) = chosen {
                        self.class_budgets.charge(class, budgets, now_ms, head.tokens);
                    }
                    let sent = self.windows.charge(now_ms, head.tokens, head.output);
                    self.ledger.insert(head.id, HeldPermit { expires_ms, wave: s.wave, sent });
                    if let Some((class, false)) = chosen {
                        self.turns.granted(class, self.classes[class].weight_value().get());
                    }
                    if deferred {
                        // Only what still waits goes on the list.
                        let left: Vec<Head<'_>> = heads
                            .iter()
                            .enumerate()
                            .filter_map(|(k, h)| {
                                let waiting = h.waiting.saturating_sub(u32::from(k == answered));
                                (waiting > 0).then_some(Head { waiting, ..*h })
                            })
                            .collect();
                        if !left.is_empty() {
                            self.register_waiting(instance, &left, now_ms, false);
                        }
                        deferred = false;
                    } else if classes && !instance.is_empty() {
                        self.granted_waiting(instance, head, heads, now_ms);
                    } else if !instance.is_empty() {
                        self.waiting.remove(instance);
                    }
                    (answered, Admission::Granted { wave: s.wave, state: s.state, limit: s.limit }, in_flight + 1)
                }
                (requests, tokens, _) => {
                    let (requests_wait, tokens_wait) = (requests.err().unwrap_or(0), tokens.err().unwrap_or(0));
                    let reason =
                        if tokens_wait > requests_wait { DenyReason::TokenBudget } else { DenyReason::RequestBudget };
                    let retry_after_ms = requests_wait.max(tokens_wait);
                    if !classes {
                        self.turn.refused(instance, now_ms, retry_after_ms);
                    }
                    (answered, Admission::Denied { reason, retry_after_ms }, in_flight)
                }
            }
        };
        // Not granted after all (the provider's window, a budget): the asks wait, on the list.
        if deferred {
            self.register_waiting(instance, heads, now_ms, false);
        }
        result
    }

    /// Puts `instance` on the waiting list for each class it asks for (keeping the place of
    /// one that already waits), with how many of its callers of each tenant wait, and (with
    /// `clear_others`) takes it off for the classes it no longer asks for
    /// (`register_waiting`).
    fn register_waiting(&mut self, instance: &str, heads: &[Head<'_>], now_ms: u64, clear_others: bool) {
        let mut members: Vec<(String, Offers)> = Vec::new();
        for head in heads {
            let name = member(head.class, instance);
            let at = match members.iter().position(|(m, _)| *m == name) {
                Some(at) => at,
                None => {
                    members.push((name, Offers { count: 0, by_tenant: Vec::new() }));
                    members.len() - 1
                }
            };
            let offers = &mut members[at].1;
            offers.count += head.waiting;
            offers.by_tenant.push((tenant_of(head.id).to_owned(), head.waiting));
        }
        for (name, offers) in &members {
            self.waiting.join(name, now_ms);
            self.waiting.saw(name, now_ms);
            self.waiting.offer(name, offers.clone());
        }
        if clear_others {
            for class in &self.classes {
                let name = member(class.name(), instance);
                if !members.iter().any(|(m, _)| *m == name) {
                    self.waiting.remove(&name);
                }
            }
        }
    }

    /// After a grant of `head` (one of `heads`) to `instance`: one caller fewer of its class
    /// and tenant waits there; its next caller waits from now, at the back of its class's
    /// line (`granted_waiting`).
    fn granted_waiting(&mut self, instance: &str, head: Head<'_>, heads: &[Head<'_>], now_ms: u64) {
        let name = member(head.class, instance);
        let waiting: u64 = heads.iter().filter(|h| h.class == head.class).map(|h| u64::from(h.waiting)).sum();
        let listed = if waiting > 1 {
            self.waiting.offers(&name).map(|o| o.by_tenant.clone()).unwrap_or_default()
        } else {
            Vec::new()
        };
        let mut granted = Some(tenant_of(head.id));
        let (mut left, mut offers) = (0u32, Vec::new());
        for (tag, count) in listed {
            let mut count = i64::from(count);
            if Some(tag.as_str()) == granted {
                count -= 1;
                granted = None;
            }
            if count > 0 {
                let count = u32::try_from(count).unwrap_or(u32::MAX);
                left += count;
                offers.push((tag, count));
            }
        }
        if left == 0 {
            self.waiting.remove(&name);
        } else {
            self.waiting.move_to_back(&name, now_ms);
            self.waiting.offer(&name, Offers { count: left, by_tenant: offers });
        }
    }

    /// Takes in what a response to permit `id` said is left of the provider's windows: the
    /// calls the provider may not have counted yet are the grants made since `id`'s, when it
    /// is still held with its mark, else the other permits held, each assumed to reserve
    /// `tokens_each` tokens (see [`ProviderWindows::report`]). `id` itself is not counted,
    /// whether it is still held or already finished. The limits it announced are learned
    /// ([`LearnedBudgets::report`]). (`take_window_report` in `lua/window_report.lua`, run by
    /// `report_window.lua` alone and by `finish.lua` before the release a report rides on.)
    pub fn report_window(&mut self, id: &str, report: WindowReport, now_ms: u64, tokens_each: u64) {
        self.ledger.purge_expired(now_ms);
        let mine = self.ledger.get(id);
        let held = self.ledger.len() - usize::from(mine.is_some());
        let others = u32::try_from(held).unwrap_or(u32::MAX);
        self.windows.report(report, now_ms, others, tokens_each, mine.and_then(|p| p.sent));
        self.learned.report(report.limits, now_ms);
    }

    /// What the provider said is left of its windows, as kept here.
    pub fn provider_windows(&self) -> ProviderWindows {
        self.windows
    }

    /// Forgets the provider's windows (an operator's clear; `lua/clear_window.lua`).
    pub fn clear_windows(&mut self) {
        self.windows.clear();
    }

    /// Settles a token reservation on the upstream's tokens budget: `delta` more tokens
    /// (negative: fewer) were used than reserved at acquire. ([`finish`](Self::finish) does it,
    /// the class's budget too.)
    pub fn settle_tokens(&mut self, delta: i64, now_ms: u64) {
        if let Some(budget) = self.budgets(now_ms).tokens {
            self.tokens_tat = Gcra::new(budget).settle(self.tokens_tat, now_ms.saturating_mul(1000), delta);
        }
    }

    /// Charges usage counted elsewhere (while another gate was in charge) to the budgets: it
    /// leaves the per-minute ones empty at most ([`Gcra::charge_past`]), the day budgets as
    /// used from the latest start its times allow (`usage.began_ago`), in debt if it must (a day's units stay spent, the refill
    /// the outage lasted is not taken twice). `reconcile.lua` is the twin.
    pub fn charge(&mut self, usage: OutageUsage, now_ms: u64) {
        if let Some(left) = usage.day_left {
            self.carry_back_day(left, now_ms);
        }
        let began_ms = now_ms.saturating_sub(duration_ms(usage.began_ago));
        self.charge_minute(usage.requests, usage.tokens, now_ms);
        self.charge_day(usage.requests, usage.tokens, began_ms, now_ms);
    }

    /// [`charge`](Self::charge) on the per-minute requests and tokens budgets only.
    fn charge_minute(&mut self, requests: u64, tokens: u64, now_ms: u64) {
        let now_us = now_ms.saturating_mul(1000);
        let budgets = self.budgets(now_ms);
        if let Some(budget) = budgets.requests {
            self.requests_tat = Gcra::new(budget).charge_past(self.requests_tat, now_us, requests);
        }
        if let Some(budget) = budgets.tokens {
            self.tokens_tat = Gcra::new(budget).charge_past(self.tokens_tat, now_us, tokens);
        }
    }

    /// The tokens budget's burst in force at `now_ms` (the largest estimate that can fit), if
    /// there is a tokens budget. In a fallback, the fleet's ([`with_fleet_budgets`](Self::with_fleet_budgets)):
    /// an estimate above the share's own burst is admitted in debt.
    pub fn tokens_burst(&self, now_ms: u64) -> Option<u64> {
        self.ceiling_budgets(now_ms).tokens.map(|b| u64::from(b.burst()))
    }

    /// The largest estimate an ask of class `class` (an index in [`classes`](Self::classes))
    /// can ever reserve at `now_ms`: the tokens burst in force, or for a class with a budget
    /// share the smaller of it and the class's own burst; `None` without a tokens budget. An
    /// ask above it is refused [`DenyReason::TokensExceedBurst`] by [`acquire`](Self::acquire).
    pub fn tokens_burst_for(&self, class: usize, now_ms: u64) -> Option<u64> {
        let upstream = self.tokens_burst(now_ms)?;
        Some(tightest_burst(upstream, self.class_tokens_burst(class, now_ms)))
    }

    /// What is left of the rate budgets in force now.
    pub fn budget_status(&self, now_ms: u64) -> BudgetStatus {
        let now_us = now_ms.saturating_mul(1000);
        let budgets = self.budgets(now_ms);
        let [input, output] = self.split_status(now_ms);
        let [requests_per_day, tokens_per_day] = self.day_status(now_ms);
        BudgetStatus {
            requests: budgets.requests.map(|b| Gcra::new(b).remaining(self.requests_tat, now_us)),
            tokens: budgets.tokens.map(|b| Gcra::new(b).remaining(self.tokens_tat, now_us)),
            input,
            output,
            requests_per_day,
            tokens_per_day,
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
        self.ledger.insert(id, HeldPermit { expires_ms: now_ms.saturating_add(lease_ms), wave, sent: None });
        wave
    }

    /// Reports the outcome of permit `id` (issued in `wave`), settles its token reservation
    /// (`token_delta` more tokens than reserved, negative for fewer, on the upstream's tokens
    /// budget and its class's; its input and output parts on the input and output budgets)
    /// and releases it, exactly as `lua/finish.lua` does. Idempotent:
    /// a second finish finds nothing held. The report counts even when the permit's lease
    /// already ended (`held` is then false): a 429 is news about the wave whoever holds the
    /// permit. A release of a held permit says which instance to wake
    /// ([`FinishReport::wake`]).
    pub fn finish(
        &mut self,
        id: &PermitId,
        wave: u64,
        signal: WaveSignal,
        token_delta: impl Into<TokenDelta>,
        now_ms: u64,
    ) -> FinishReport {
        let delta = token_delta.into();
        let back = |n: i64| if n < 0 { n.unsigned_abs() } else { 0 };
        match delta.windows {
            WindowsBack::Reservation => {
                // Once: a permit no longer held was given back at its first finish.
                if let Some(held) = self.ledger.get(id.as_str()) {
                    let place = held.sent.map(|mark| mark.requests);
                    self.windows.refuse(back(delta.total), back(delta.output), place, now_ms);
                }
            }
            WindowsBack::Output if delta.output < 0 => self.windows.give_back(back(delta.output), now_ms),
            WindowsBack::Output | WindowsBack::Nothing => {}
        }
        self.split_settle(delta, now_ms);
        self.day_settle(delta.total, now_ms);
        let token_delta = delta.total;
        if token_delta != 0 && self.budgets(now_ms).tokens.is_some() {
            self.settle_tokens(token_delta, now_ms);
            if !self.classes.is_empty() {
                let class = self.class_config().index_or_default(class_of(id.as_str()));
                self.class_budgets.settle(class, self.budgets(now_ms), token_delta, now_ms);
            }
        }
        self.finish_text(id.as_str(), wave, signal, now_ms)
    }

    /// Reports the outcome of permit `id` by its text and releases it, settling nothing (kept
    /// until the engine moves to [`finish`](Self::finish)).
    #[doc(hidden)]
    pub fn finish_text(&mut self, id: &str, wave: u64, signal: WaveSignal, now_ms: u64) -> FinishReport {
        self.ledger.purge_expired(now_ms);
        self.machine.poll(now_ms);
        let (rate_limit, transition) = match signal {
            WaveSignal::Success => (None, self.machine.on_success(wave, self.in_flight(), now_ms)),
            WaveSignal::ServedSuccess { at_most, span } => {
                let fleet = span.map_or(0, |span| self.served.served_beside(span, now_ms));
                (None, self.machine.on_success(wave, self.in_flight().min(at_most.max(fleet)), now_ms))
            }
            WaveSignal::RateLimited { retry_after } => {
                (Some(self.machine.on_rate_limited(wave, now_ms, retry_after)), None)
            }
            WaveSignal::RateLimitedAmong { retry_after, span } => {
                if self.served.met(id, span, now_ms).is_some_and(|met| met <= self.machine.snapshot().limit) {
                    (Some(self.machine.on_rate_limited(wave, now_ms, retry_after)), None)
                } else {
                    (None, None)
                }
            }
            WaveSignal::Neutral => (None, None),
            WaveSignal::Went { span, served } => {
                self.served.record(id, span, served, now_ms);
                (None, None)
            }
        };
        let held = self.ledger.remove(id).is_some();
        let mut wake = None;
        let mut handed = None;
        if held {
            self.waiting.drop_stale(now_ms);
            let woken = if self.classes.is_empty() {
                self.waiting.pop_longest().map(|(member, head)| {
                    let instance = member_instance(&member).to_owned();
                    if let Some(head) = head {
                        handed = self.hand_off(&instance, head, now_ms);
                    }
                    instance
                })
            } else {
                self.to_wake(now_ms)
            };
            wake = woken.and_then(|name| Instance::new(name).ok());
        }
        let (after, in_flight) = (self.machine.snapshot(), self.in_flight());
        FinishReport { held, rate_limit, transition, after, in_flight, wake, handed }
    }

    /// The hand-off (`hand_off` in `lua/finish.lua`): grants the permit a release just freed to
    /// the ask `instance` last made at the limit, as its acquire would have, so the woken process
    /// needs no acquire of its own. Only where nothing but the wave decides: no rate or day
    /// budget in force; the wave, the provider's windows and the budgets' turn must admit it; an
    /// id already held is not granted twice. Returns the permit and its wave, or `None` (the
    /// instance is woken and asks, as without a hand-off).
    fn hand_off(&mut self, instance: &str, head: WaitingHead, now_ms: u64) -> Option<(PermitId, u64)> {
        let id = PermitId::parse(&head.id).ok()?;
        if self.budgets(now_ms) != Budgets::default() || self.ledger.get(&head.id).is_some() {
            return None;
        }
        if let Admission::Denied { .. } = self.machine.admit(now_ms, self.in_flight()) {
            return None;
        }
        if self.windows.wait_ms(now_ms, head.tokens, head.output).is_some()
            || self.turn.wait_ms(instance, now_ms).is_some()
        {
            return None;
        }
        self.turn.granted(instance, now_ms);
        let wave = self.machine.snapshot().wave;
        let sent = self.windows.charge(now_ms, head.tokens, head.output);
        let lease_ms = head.lease_ms.clamp(1, HANDED_LEASE_MAX_MS);
        self.ledger.insert(&head.id, HeldPermit { expires_ms: now_ms.saturating_add(lease_ms), wave, sent });
        Some((id, wave))
    }

    /// The instance the fleet-wide choice reaches with the permits free now
    /// (`process_to_wake`): nobody when no member asked lately.
    fn to_wake(&self, now_ms: u64) -> Option<String> {
        self.waiting.fresh(now_ms).next()?;
        let limit = self.machine.snapshot().limit;
        let mut fleet = fleet::classes(self.class_config(), limit, now_ms, true, &self.ledger, &self.waiting);
        fleet::cap(&mut fleet, &self.class_budgets, self.budgets(now_ms), now_ms, |_| 1);
        fleet::observe(&mut self.turns.clone(), &mut fleet);
        fleet::to_wake(&mut fleet, i64::from(limit) - i64::from(self.in_flight()))
    }

    /// Extends the leases of permits whose calls are still running (`lua/renew.lua`); an id no
    /// longer held (its lease ended) is registered again, as [`adopt`](Self::adopt) does:
    /// a running call counts against the limit whatever happened to its registration. Returns
    /// the ids registered again (the caller releases any whose call ended meanwhile).
    pub fn renew(&mut self, ids: &[PermitId], now_ms: u64, lease_ms: u64) -> Vec<PermitId> {
        self.ledger.purge_expired(now_ms);
        let expires_ms = now_ms.saturating_add(lease_ms);
        let mut again = Vec::new();
        for id in ids {
            if !self.ledger.renew(id.as_str(), expires_ms) {
                self.adopt(id.as_str(), now_ms, lease_ms);
                again.push(id.clone());
            }
        }
        again
    }

    /// [`renew`](Self::renew) by the ids' texts; returns how many were registered again (kept
    /// until the engine moves to [`renew`](Self::renew)).
    #[doc(hidden)]
    pub fn renew_text<'a>(&mut self, ids: impl IntoIterator<Item = &'a str>, now_ms: u64, lease_ms: u64) -> usize {
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

    /// [`status`](Self::status), and for each priority class (in configured order) its
    /// permits in flight and its callers waiting (those of instances that asked within
    /// [`PRIORITY_FRESH_MS`]), as `lua/status.lua` counts them.
    pub fn status_with_classes(&mut self, now_ms: u64) -> (WaveSnapshot, usize, Vec<(u32, u32)>) {
        let (snapshot, in_flight) = self.status(now_ms);
        let classes = if self.classes.is_empty() {
            Vec::new()
        } else {
            fleet::classes(self.class_config(), snapshot.limit, now_ms, false, &self.ledger, &self.waiting)
                .iter()
                .map(|c| (c.view.in_flight, c.view.demand))
                .collect()
        };
        (snapshot, in_flight, classes)
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

/// The burst in force for a class's asks: the upstream's, or the class's own when smaller.
fn tightest_burst(upstream: u64, own: Option<u64>) -> u64 {
    own.map_or(upstream, |own| own.min(upstream))
}
