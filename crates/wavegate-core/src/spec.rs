//! The executable specification of the gates: tables of steps and expected answers.
//!
//! Two implementations must agree: [`LocalGate`] (Rust: local mode, the outage fallback) and
//! the Lua scripts (shared mode, in Redis). Each implements [`WaveModel`] through its entry
//! points — `acquire` with a process's [`Ask`]s, `finish`, `renew`, `report_window`, the
//! status — and [`run_case`] drives one through a [`SpecCase`], reporting the first step whose
//! answer differs. The tables cover the wave machine (one process, one ask at a time), the
//! provider's windows and learned limits, and the choice of class and tenant across several
//! processes waiting at one gate (several asks at once, reserves, weighted turns, class
//! budgets, the count window, a head that can never fit). They use short durations (tens of
//! milliseconds) with margins, and an `Advance` between asks whose order matters, so a model
//! on a real clock (Redis `TIME`, advanced by sleeping) passes them as well as one on a manual
//! clock.
//!
//! The fallback's gate has a table of its own, [`fallback_cases`]; so have the carry-back, [`carry_back_cases`],
//! the rebase to a new base limit, [`rebase_cases`], and a budget's TAT across a change of its
//! rate, [`rescale_cases`].
//!
//! This module is test material, behind the `spec` feature.
//!
//! ```
//! use wavegate_core::spec::{cases, run_case, GateModel};
//!
//! for case in cases() {
//!     let mut model = GateModel::new(&case);
//!     run_case(&case, &mut model).unwrap();
//! }
//! ```

use std::collections::HashMap;
use std::fmt;
use std::num::NonZeroU32;
use std::time::Duration;

use crate::ask::{Ask, Decision};
use crate::clock::{Clock, ManualClock};
use crate::cooldown::CooldownPolicy;
use crate::gate::{LocalGate, WaveSignal};
use crate::gcra::{Budgets, DayBudget, RateBudget};
use crate::learned_limit::{LearnedLimit, LearnedLimits};
use crate::permit_id::{Instance, PermitId, TenantTag};
use crate::priority::PriorityClass;
use crate::provider_window::{WindowLeft, WindowReport};
use crate::served_spans::ServedSpan;
use crate::token_delta::{TokenDelta, WindowsBack};
use crate::wave::{DenyReason, Recovery, WaveConfig, WaveState};

mod carry_back;
mod classes;
mod fallback;
mod rebase;
mod rescale;
mod waves;
pub use carry_back::{CarryBackCase, carry_back_cases};
pub use fallback::{FallbackAsk, FallbackCase, FallbackExpect, fallback_cases};
pub use rebase::{RebaseCase, rebase_cases};
pub use rescale::{RescaleCase, rescale_cases};

/// The instance of the one process of the cases that ask with [`Step::Acquire`].
pub const SPEC_INSTANCE: &str = "spec";

/// One named scenario with the configuration it runs under.
#[derive(Debug, Clone)]
pub struct SpecCase {
    /// What the case shows.
    pub name: &'static str,
    /// The base concurrency limit.
    pub base_limit: u32,
    /// Consecutive successes needed to leave PROBE.
    pub probe_successes: u32,
    /// The cooldown ladder, in milliseconds.
    pub ladder_ms: Vec<u64>,
    /// The shortest cooldown a `Retry-After` is clamped to, in milliseconds.
    pub min_cooldown_ms: u64,
    /// The longest cooldown, in milliseconds.
    pub max_cooldown_ms: u64,
    /// The lease every acquire asks for, in milliseconds.
    pub lease_ms: u64,
    /// A requests-per-minute budget: (per minute, burst).
    pub requests_per_minute: Option<(u32, u32)>,
    /// A tokens-per-minute budget: (per minute, burst).
    pub tokens_per_minute: Option<(u32, u32)>,
    /// An input-tokens-per-minute budget: (per minute, burst).
    pub input_per_minute: Option<(u32, u32)>,
    /// An output-tokens-per-minute budget: (per minute, burst).
    pub output_per_minute: Option<(u32, u32)>,
    /// A requests-per-day budget: (per day, burst).
    pub requests_per_day: Option<(u64, u64)>,
    /// A tokens-per-day budget: (per day, burst).
    pub tokens_per_day: Option<(u64, u64)>,
    /// How the limit grows back.
    pub recovery: Recovery,
    /// [`Recovery::Adaptive`]'s re-test spacing, first and longest, in milliseconds.
    pub retest_ms: (u64, u64),
    /// The priority classes, in configured order (none: no choice of class).
    pub classes: Vec<SpecClass>,
    /// The index of the class that takes permits whose id names none.
    pub default_class: usize,
    /// A permit counts in its class's share only while its lease ends at least this far
    /// ahead (ms; 0: always).
    pub class_window_ms: u64,
    /// The steps, in order.
    pub steps: Vec<Step>,
}

/// A priority class of a case.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpecClass {
    /// Its name.
    pub name: &'static str,
    /// Its weight.
    pub weight: u32,
    /// Its reserved share of the limit, in percent.
    pub reserve_percent: u8,
    /// Its share of the rate budgets, in percent (100: no cap).
    pub budget_percent: u8,
}

impl SpecCase {
    /// The rate budgets the case describes.
    pub fn budgets(&self) -> Budgets {
        let budget = |b: Option<(u32, u32)>| b.and_then(|(rate, burst)| RateBudget::new(rate, burst));
        Budgets {
            requests: budget(self.requests_per_minute),
            tokens: budget(self.tokens_per_minute),
            input: budget(self.input_per_minute),
            output: budget(self.output_per_minute),
            requests_per_day: self.requests_per_day.and_then(|(rate, burst)| DayBudget::new(rate, burst)),
            tokens_per_day: self.tokens_per_day.and_then(|(rate, burst)| DayBudget::new(rate, burst)),
        }
    }

    /// The wave configuration the case describes.
    pub fn wave_config(&self) -> WaveConfig {
        WaveConfig {
            base_limit: NonZeroU32::new(self.base_limit).unwrap_or(NonZeroU32::MIN),
            probe_successes: NonZeroU32::new(self.probe_successes).unwrap_or(NonZeroU32::MIN),
            cooldown: CooldownPolicy {
                ladder: self.ladder_ms.iter().copied().map(Duration::from_millis).collect(),
                min: Duration::from_millis(self.min_cooldown_ms),
                max: Duration::from_millis(self.max_cooldown_ms),
            },
            recovery: self.recovery,
            retest_after: Duration::from_millis(self.retest_ms.0),
            retest_max: Duration::from_millis(self.retest_ms.1),
            retest_rounds_max: WaveConfig::DEFAULT_RETEST_ROUNDS_MAX,
        }
    }

    /// The priority classes the case describes.
    ///
    /// # Panics
    ///
    /// If a class of the table is not a valid class (a bug of the table).
    pub fn priority_classes(&self) -> Vec<PriorityClass> {
        self.classes
            .iter()
            .map(|c| {
                PriorityClass::new(c.name)
                    .and_then(|p| p.weight(c.weight))
                    .and_then(|p| p.reserve_percent(c.reserve_percent))
                    .and_then(|p| p.budget_percent(c.budget_percent))
                    .expect("the tables' classes are valid")
            })
            .collect()
    }

    /// The count window of the classes.
    pub fn class_window(&self) -> Duration {
        Duration::from_millis(self.class_window_ms)
    }
}

/// One head a process offers in a [`Step::AcquireAmong`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpecAsk {
    /// The permit's name (its id is made at its first appearance in the case).
    pub permit: &'static str,
    /// Its class.
    pub class: &'static str,
    /// Its tenant's key, if it names one.
    pub tenant: Option<&'static str>,
    /// The tokens to reserve.
    pub tokens: u64,
    /// How many of the process's callers it stands for.
    pub waiting: u32,
}

/// Which instance a release must wake.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wakes {
    /// Not checked.
    Unchecked,
    /// Nobody.
    Nobody,
    /// This instance, and no permit handed to it.
    Instance(&'static str),
    /// This instance, and this permit (by its name in the case) handed to it in the same step.
    Hands(&'static str, &'static str),
}

/// One step of a case.
// A table's steps are written once and read once per run; a report's fields stay inline so the
// tables read as what an answer says.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// The case's one process ([`SPEC_INSTANCE`]) asks for the permit named `permit`, alone
    /// and without a class (the default class on an upstream with classes); compare the
    /// answer.
    Acquire {
        /// The permit's name.
        permit: &'static str,
        /// The tokens to reserve.
        tokens: u64,
        /// The expected answer.
        expect: Expect,
    },
    /// [`Acquire`](Self::Acquire), `output` of the `tokens` being the answer's (the input and
    /// output budgets).
    AcquireSplit {
        /// The permit's name.
        permit: &'static str,
        /// The tokens to reserve, in all.
        tokens: u64,
        /// Of them, the output.
        output: u64,
        /// The expected answer.
        expect: Expect,
    },
    /// Permit `permit` finishes (neutral, held), settling `token_delta` in all, `output_delta`
    /// of it output.
    FinishSplit {
        /// The permit's name.
        permit: &'static str,
        /// Tokens used beyond the reservation, in all.
        token_delta: i64,
        /// Of them, output.
        output_delta: i64,
    },
    /// Permit `permit`'s call was refused by the provider (a 429 of a window, which cuts
    /// nothing): it finishes (neutral, held) giving back its whole reservation, `tokens` in
    /// all and `output` of them the answer's, to the budgets and as `windows` says to the
    /// provider's windows ([`TokenDelta::refused`]).
    Refused {
        /// The permit's name.
        permit: &'static str,
        /// The tokens it reserved, in all.
        tokens: u64,
        /// Of them, the output.
        output: u64,
        /// What the provider's windows take back.
        windows: WindowsBack,
    },
    /// Process `instance` asks for one permit for its heads `asks` at once; compare the answer
    /// and the ask it names.
    AcquireAmong {
        /// The asking process.
        instance: &'static str,
        /// Its heads.
        asks: Vec<SpecAsk>,
        /// The permit the answer must name.
        answers: &'static str,
        /// The expected answer.
        expect: Expect,
    },
    /// Finish `permit` with `signal`, tagged with the wave it was granted in (or `wave` when
    /// given, for a permit that was never granted); compare whether it was held, and whom it
    /// woke.
    Finish {
        /// The permit's name.
        permit: &'static str,
        /// An explicit wave tag; `None` uses the wave of the permit's last grant.
        wave: Option<u64>,
        /// The outcome.
        signal: SpecSignal,
        /// Tokens used beyond the reservation (negative: a refund).
        token_delta: i64,
        /// Whether the model must say the permit was held.
        held: bool,
        /// Which instance the release must wake.
        wakes: Wakes,
    },
    /// Renew the leases of `permits`; compare which were registered again.
    Renew {
        /// The permits whose calls still run.
        permits: Vec<&'static str>,
        /// Those the gate must say it registered again.
        again: Vec<&'static str>,
    },
    /// Let time pass.
    Advance {
        /// How long, in milliseconds.
        ms: u64,
    },
    /// A response said what is left of the provider's windows (`(remaining, reset in ms)`)
    /// and announced its limits (`(limit, window in ms)`), after its permit was finished;
    /// the calls it reserved `tokens_each` tokens.
    ReportWindow {
        /// The permit whose answer it is (still held), or `None`: an answer with no permit
        /// (the calls in flight are then the ones the provider may not have counted).
        by: Option<&'static str>,
        /// The requests window.
        requests: Option<(u64, u64)>,
        /// The tokens window.
        tokens: Option<(u64, u64)>,
        /// Tokens the reporting call reserved (the others in flight are assumed to as well).
        tokens_each: u64,
        /// The requests limit announced, with its window.
        learned_requests: Option<(u64, u64)>,
        /// The tokens limit announced, with its window.
        learned_tokens: Option<(u64, u64)>,
        /// The input and the output tokens limits announced (Anthropic's ITPM and OTPM), each
        /// with its window.
        learned_parts: [Option<(u64, u64)>; 2],
        /// The limit the requests window refills to, when it is a continuously refilled
        /// bucket (OpenAI): what is left grows back to it over the reset.
        refills_requests: Option<u64>,
        /// Likewise for the tokens window.
        refills_tokens: Option<u64>,
        /// Anthropic's input and output windows, each `(remaining, reset in ms, limit it
        /// refills to)` (0: a fixed window).
        parts: [Option<(u64, u64, u64)>; 2],
        /// The answer refused its call (a 429), which had reserved `(tokens, output of them)`
        /// ([`WindowReport::refused`]); `None`: it served it.
        refused: Option<(u64, u64)>,
    },
    /// Compare the model's status.
    Status {
        /// Expected state.
        state: WaveState,
        /// Expected limit.
        limit: u32,
        /// Expected wave id.
        wave: u64,
        /// Expected number of permits held.
        in_flight: usize,
    },
    /// The budgets in force change, as a live change of a rate or a burst changes them (each
    /// `(per minute, burst)`; only for a budget the case is configured with).
    SetBudgets {
        /// The requests budget from now on.
        requests: Option<(u32, u32)>,
        /// The tokens budget from now on.
        tokens: Option<(u32, u32)>,
    },
    /// Compare each class's permits in flight and callers waiting (of the processes that
    /// asked lately), in configured order.
    ClassStatus {
        /// (in flight, waiting) per class.
        classes: Vec<(u32, u32)>,
    },
}

/// The expected answer to an acquire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expect {
    /// Granted in this wave, state and limit.
    Granted {
        /// Wave id.
        wave: u64,
        /// State.
        state: WaveState,
        /// Limit.
        limit: u32,
    },
    /// Refused because of a cooldown, with a wait in `(0, max_cooldown]`.
    DeniedCooldown,
    /// Refused because the limit is reached (or the choice reached other processes first).
    DeniedAtLimit,
    /// Refused by the requests budget, with a wait in `(0, 60 s]`.
    DeniedRequests,
    /// Refused by the tokens budget, with a wait in `(0, 60 s]`.
    DeniedTokens,
    /// Refused by a requests budget (a day's), with a wait of this many ms, less at most a
    /// second (the Lua twin runs on the server's clock, which moves between steps).
    DeniedRequestsFor(u64),
    /// Refused by a tokens budget (a day's), with a wait as [`DeniedRequestsFor`](Self::DeniedRequestsFor).
    DeniedTokensFor(u64),
    /// Refused: the estimate can never fit the tokens burst in force.
    DeniedTooLarge,
    /// Refused by a spent provider window, with a wait in `(0, max_ms]`.
    DeniedProviderWindow {
        /// The longest wait expected.
        max_ms: u64,
    },
    /// Refused: the budgets' room is another process's turn, with a wait in `(0, max_ms]`.
    DeniedEarlierWaiter {
        /// The longest wait expected.
        max_ms: u64,
    },
}

impl Expect {
    /// Whether `decision` is this answer (the ask it names is checked apart), in a case whose
    /// longest cooldown is `max_cooldown_ms`.
    fn matches(&self, decision: &Decision, max_cooldown_ms: u64) -> bool {
        let waits = |wait: u64| wait > 0 && wait <= 60_000;
        let about = |wait: u64, ms: u64| wait <= ms && wait + 1_000 > ms;
        match (*self, decision) {
            (Expect::Granted { wave, state, limit }, Decision::Granted { wave: w, state: s, limit: l, .. }) => {
                (wave, state, limit) == (*w, *s, *l)
            }
            (expect, Decision::Denied { reason, retry_after_ms, .. }) => match expect {
                Expect::Granted { .. } => false,
                Expect::DeniedCooldown => {
                    *reason == DenyReason::Cooldown && *retry_after_ms > 0 && *retry_after_ms <= max_cooldown_ms
                }
                Expect::DeniedAtLimit => *reason == DenyReason::AtLimit,
                Expect::DeniedRequests => *reason == DenyReason::RequestBudget && waits(*retry_after_ms),
                Expect::DeniedTokens => *reason == DenyReason::TokenBudget && waits(*retry_after_ms),
                Expect::DeniedRequestsFor(ms) => *reason == DenyReason::RequestBudget && about(*retry_after_ms, ms),
                Expect::DeniedTokensFor(ms) => *reason == DenyReason::TokenBudget && about(*retry_after_ms, ms),
                Expect::DeniedTooLarge => *reason == DenyReason::TokensExceedBurst,
                Expect::DeniedProviderWindow { max_ms } => {
                    *reason == DenyReason::ProviderWindow && *retry_after_ms > 0 && *retry_after_ms <= max_ms
                }
                Expect::DeniedEarlierWaiter { max_ms } => {
                    *reason == DenyReason::EarlierWaiter && *retry_after_ms > 0 && *retry_after_ms <= max_ms
                }
            },
            _ => false,
        }
    }
}

/// An outcome, in table form.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpecSignal {
    /// Success.
    Success,
    /// 429, with a `Retry-After` in milliseconds if given.
    RateLimited(Option<u64>),
    /// A non-wave outcome (5xx, timeout, cancelled).
    Neutral,
    /// A success while the provider served at most this many calls at once (shadow mode).
    Served(u32),
    /// The same, with the call's span: it went and ended so many ms before its report (each
    /// model places them on its clock; the gate counts the fleet's served calls recorded
    /// beside it).
    ServedSpan(u32, u64, u64),
    /// A call in shadow in a fleet at the provider from so many ms before its report to so
    /// many, served or not: recorded for the fleet's counts (the id is a pass's, not held).
    Recorded(u64, u64, bool),
    /// A 429 of a call in shadow in a fleet, that went and ended so many ms before its report:
    /// the limit's only if the fleet's served calls beside it leave it within the limit.
    RateLimitedAmong(u64, u64),
}

impl SpecSignal {
    /// The signal as the gate takes it, reported when its clock reads `now_ms`.
    pub fn to_wave_signal(self, now_ms: u64) -> WaveSignal {
        let span_of = |went_ago: u64, ended_ago: u64| {
            ServedSpan::ago(Duration::from_millis(went_ago), Duration::from_millis(ended_ago), now_ms)
        };
        match self {
            SpecSignal::Success => WaveSignal::Success,
            SpecSignal::RateLimited(ms) => WaveSignal::RateLimited { retry_after: ms.map(Duration::from_millis) },
            SpecSignal::Neutral => WaveSignal::Neutral,
            SpecSignal::Served(at_most) => WaveSignal::ServedSuccess { at_most, span: None },
            SpecSignal::ServedSpan(at_most, went_ago, ended_ago) => {
                WaveSignal::ServedSuccess { at_most, span: Some(span_of(went_ago, ended_ago)) }
            }
            SpecSignal::Recorded(went_ago, ended_ago, served) => {
                WaveSignal::Went { span: span_of(went_ago, ended_ago), served }
            }
            SpecSignal::RateLimitedAmong(went_ago, ended_ago) => {
                WaveSignal::RateLimitedAmong { retry_after: None, span: span_of(went_ago, ended_ago) }
            }
        }
    }
}

/// An implementation of the gate under test, through its entry points.
pub trait WaveModel {
    /// What can go wrong talking to it (I/O for the Redis model).
    type Error: fmt::Display;
    /// Process `instance` asks for one permit for `asks`, with the case's lease.
    fn acquire(&mut self, instance: &Instance, asks: &[Ask]) -> Result<Decision, Self::Error>;
    /// Finishes permit `id`, tagged with `wave`, settling `token_delta`.
    fn finish(
        &mut self,
        id: &PermitId,
        wave: u64,
        signal: WaveSignal,
        token_delta: TokenDelta,
    ) -> Result<Released, Self::Error>;
    /// Renews the leases of `ids` with the case's lease; the ids registered again.
    fn renew(&mut self, ids: &[PermitId]) -> Result<Vec<PermitId>, Self::Error>;
    /// Lets `ms` milliseconds pass.
    fn advance(&mut self, ms: u64) -> Result<(), Self::Error>;
    /// Its clock now, in ms (the clock a [`ServedSpan`] is given on).
    fn now_ms(&mut self) -> Result<u64, Self::Error>;
    /// Puts `budgets` in force from now on (a live change of a rate or a burst).
    fn set_budgets(&mut self, budgets: Budgets) -> Result<(), Self::Error>;
    /// The current state, the number of permits held and the classes' counts.
    fn status(&mut self) -> Result<ModelStatus, Self::Error>;
    /// Takes in what a response to permit `id` (`None`: no permit) said is left of the
    /// provider's windows, `tokens_each` tokens reserved by the reporting call.
    fn report_window(
        &mut self,
        id: Option<&PermitId>,
        report: WindowReport,
        tokens_each: u64,
    ) -> Result<(), Self::Error>;
}

/// What a release did, as every implementation says it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Released {
    /// Whether the permit was held.
    pub held: bool,
    /// The instance it woke.
    pub wake: Option<Instance>,
    /// The permit it handed to the instance it woke, and its wave.
    pub handed: Option<(PermitId, u64)>,
}

/// What a [`WaveModel`] reports of its state: the parts every implementation shares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelStatus {
    /// The state.
    pub state: WaveState,
    /// The current limit.
    pub limit: u32,
    /// The current wave id.
    pub wave: u64,
    /// Permits held.
    pub in_flight: usize,
    /// Per class (configured order): permits in flight, callers waiting.
    pub classes: Vec<(u32, u32)>,
}

/// The first step at which a model disagreed with the table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpecFailure {
    /// The case.
    pub case: &'static str,
    /// The index of the step in the case.
    pub step: usize,
    /// What the table expected.
    pub expected: String,
    /// What the model answered.
    pub got: String,
}

impl fmt::Display for SpecFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "case `{}`, step {}: expected {}, got {}", self.case, self.step, self.expected, self.got)
    }
}

impl std::error::Error for SpecFailure {}

/// The ids of a case's permits, each made at its first appearance: the typed form both gates
/// take ([`PermitId::new`]), with a sequence number per permit.
#[derive(Debug, Default)]
struct Ids {
    by_name: HashMap<&'static str, PermitId>,
}

impl Ids {
    fn get(&mut self, permit: &'static str, class: Option<&str>, instance: &str, tenant: Option<&str>) -> PermitId {
        let next = self.by_name.len() as u64 + 1;
        self.by_name
            .entry(permit)
            .or_insert_with(|| {
                let instance = Instance::new(instance).expect("the tables' instances are valid");
                PermitId::new(class, &instance, next, tenant.map(TenantTag::of))
            })
            .clone()
    }

    /// A permit of the case's one process, without a class.
    fn plain(&mut self, permit: &'static str) -> PermitId {
        self.get(permit, None, SPEC_INSTANCE, None)
    }

    fn name_of(&self, id: &PermitId) -> String {
        self.by_name.iter().find(|(_, known)| *known == id).map_or_else(|| id.to_string(), |(name, _)| name.to_string())
    }
}

/// Drives `model` through `case`; the first disagreement is the error.
pub fn run_case<M: WaveModel>(case: &SpecCase, model: &mut M) -> Result<(), SpecFailure> {
    let mut granted_in: HashMap<&str, u64> = HashMap::new();
    let mut ids = Ids::default();
    for (index, step) in case.steps.iter().enumerate() {
        let fail = |expected: String, got: String| SpecFailure { case: case.name, step: index, expected, got };
        let io = |e: M::Error| fail(format!("{step:?}"), format!("model error: {e}"));
        match step {
            Step::Acquire { .. } | Step::AcquireSplit { .. } | Step::AcquireAmong { .. } => {
                let (instance, asks, answers, expect) = match step {
                    Step::Acquire { permit, tokens, expect } => {
                        let ask = Ask { id: ids.plain(permit), tokens: *tokens, output: 0, waiting: 1 };
                        (SPEC_INSTANCE, vec![ask], *permit, expect)
                    }
                    Step::AcquireSplit { permit, tokens, output, expect } => {
                        let ask = Ask { id: ids.plain(permit), tokens: *tokens, output: *output, waiting: 1 };
                        (SPEC_INSTANCE, vec![ask], *permit, expect)
                    }
                    Step::AcquireAmong { instance, asks, answers, expect } => {
                        let asks = asks
                            .iter()
                            .map(|a| Ask {
                                id: ids.get(a.permit, Some(a.class), instance, a.tenant),
                                tokens: a.tokens,
                                output: 0,
                                waiting: a.waiting,
                            })
                            .collect();
                        (*instance, asks, *answers, expect)
                    }
                    _ => unreachable!("an acquire"),
                };
                let instance = Instance::new(instance).expect("the tables' instances are valid");
                let got = model.acquire(&instance, &asks).map_err(io)?;
                let named = ids.name_of(got.id());
                if !expect.matches(&got, case.max_cooldown_ms) || named != answers {
                    return Err(fail(format!("acquire answering {answers}: {expect:?}"), format!("{named}: {got:?}")));
                }
                if let Decision::Granted { wave, .. } = got {
                    granted_in.insert(answers, wave);
                }
            }
            Step::FinishSplit { .. } | Step::Refused { .. } => {
                let (permit, delta) = match step {
                    Step::FinishSplit { permit, token_delta, output_delta } => {
                        (permit, TokenDelta::new(*token_delta, *output_delta))
                    }
                    Step::Refused { permit, tokens, output, windows } => {
                        (permit, TokenDelta::refused((*tokens, *output), *windows))
                    }
                    _ => unreachable!("a finish with a split delta"),
                };
                let tag = granted_in.get(permit).copied().unwrap_or(0);
                let got = model.finish(&ids.plain(permit), tag, WaveSignal::Neutral, delta).map_err(io)?;
                if !got.held {
                    return Err(fail(format!("finish of {permit}: held"), format!("{got:?}")));
                }
            }
            Step::Finish { permit, wave, signal, token_delta, held, wakes } => {
                let tag = wave.or_else(|| granted_in.get(permit).copied()).unwrap_or(0);
                let id = ids.plain(permit);
                let signal = signal.to_wave_signal(model.now_ms().map_err(io)?);
                let got = model.finish(&id, tag, signal, (*token_delta).into()).map_err(io)?;
                let woke = got.wake.as_ref().map(Instance::as_str);
                let handed = got.handed.as_ref().map(|(id, _)| ids.name_of(id));
                let wake_ok = match wakes {
                    Wakes::Unchecked => true,
                    Wakes::Nobody => woke.is_none() && handed.is_none(),
                    Wakes::Instance(name) => woke == Some(*name) && handed.is_none(),
                    Wakes::Hands(name, permit) => woke == Some(*name) && handed.as_deref() == Some(*permit),
                };
                if got.held != *held || !wake_ok {
                    return Err(fail(
                        format!("finish {permit}: held={held}, wakes {wakes:?}"),
                        format!("held={}, woke {woke:?}, handed {handed:?}", got.held),
                    ));
                }
                if let (Wakes::Hands(_, handed), Some((_, wave))) = (wakes, &got.handed) {
                    granted_in.insert(handed, *wave);
                }
            }
            Step::Renew { permits, again } => {
                let sent: Vec<PermitId> = permits.iter().map(|p| ids.plain(p)).collect();
                let got = model.renew(&sent).map_err(io)?;
                let mut got: Vec<String> = got.iter().map(|id| ids.name_of(id)).collect();
                let mut expected: Vec<String> = again.iter().map(|p| p.to_string()).collect();
                got.sort();
                expected.sort();
                if got != expected {
                    return Err(fail(format!("renew registers again {expected:?}"), format!("{got:?}")));
                }
            }
            Step::Advance { ms } => model.advance(*ms).map_err(io)?,
            Step::SetBudgets { requests, tokens } => {
                let budget = |b: &Option<(u32, u32)>| b.and_then(|(rate, burst)| RateBudget::new(rate, burst));
                model
                    .set_budgets(Budgets { requests: budget(requests), tokens: budget(tokens), ..case.budgets() })
                    .map_err(io)?;
            }
            Step::ReportWindow {
                by,
                requests,
                tokens,
                tokens_each,
                learned_requests,
                learned_tokens,
                learned_parts: [learned_input, learned_output],
                refills_requests,
                refills_tokens,
                parts: [input, output],
                refused,
            } => {
                let left = |w: &Option<(u64, u64)>, refills_to: &Option<u64>| {
                    w.map(|(remaining, reset_ms)| WindowLeft { remaining, reset_ms, refills_to: *refills_to })
                };
                let learned = |l: &Option<(u64, u64)>| l.map(|(limit, window_ms)| LearnedLimit { limit, window_ms });
                let limits = LearnedLimits {
                    requests: learned(learned_requests),
                    tokens: learned(learned_tokens),
                    input: learned(learned_input),
                    output: learned(learned_output),
                };
                let part = |p: &Option<(u64, u64, u64)>| {
                    p.map(|(remaining, reset_ms, to)| WindowLeft {
                        remaining,
                        reset_ms,
                        refills_to: (to > 0).then_some(to),
                    })
                };
                let report = WindowReport {
                    requests: left(requests, refills_requests),
                    tokens: left(tokens, refills_tokens),
                    input: part(input),
                    output: part(output),
                    limits,
                    refused: *refused,
                };
                let id = by.map(|p| ids.plain(p));
                model.report_window(id.as_ref(), report, *tokens_each).map_err(io)?;
            }
            Step::Status { state, limit, wave, in_flight } => {
                let status = model.status().map_err(io)?;
                let got = (status.state, status.limit, status.wave, status.in_flight);
                if got != (*state, *limit, *wave, *in_flight) {
                    return Err(fail(
                        format!("status {state} limit {limit} wave {wave} in flight {in_flight}"),
                        format!("status {} limit {} wave {} in flight {}", got.0, got.1, got.2, got.3),
                    ));
                }
            }
            Step::ClassStatus { classes } => {
                let status = model.status().map_err(io)?;
                if status.classes != *classes {
                    return Err(fail(format!("classes {classes:?}"), format!("classes {:?}", status.classes)));
                }
            }
        }
    }
    Ok(())
}

/// [`LocalGate`] on a [`ManualClock`], as a [`WaveModel`].
#[derive(Debug)]
pub struct GateModel {
    gate: LocalGate,
    clock: ManualClock,
    lease_ms: u64,
}

impl GateModel {
    /// A fresh gate configured for `case` (as [`LocalGate::for_upstream`] configures one).
    pub fn new(case: &SpecCase) -> Self {
        let gate = LocalGate::with_budgets(case.wave_config(), case.budgets()).with_classes(
            &case.priority_classes(),
            case.default_class,
            case.class_window(),
        );
        Self { gate, clock: ManualClock::new(1_000_000), lease_ms: case.lease_ms }
    }
}

impl WaveModel for GateModel {
    type Error = std::convert::Infallible;

    fn acquire(&mut self, instance: &Instance, asks: &[Ask]) -> Result<Decision, Self::Error> {
        Ok(self.gate.acquire(instance, asks, self.lease_ms, self.clock.now_ms()))
    }

    fn finish(
        &mut self,
        id: &PermitId,
        wave: u64,
        signal: WaveSignal,
        token_delta: TokenDelta,
    ) -> Result<Released, Self::Error> {
        let report = self.gate.finish(id, wave, signal, token_delta, self.clock.now_ms());
        Ok(Released { held: report.held, wake: report.wake, handed: report.handed })
    }

    fn renew(&mut self, ids: &[PermitId]) -> Result<Vec<PermitId>, Self::Error> {
        Ok(self.gate.renew(ids, self.clock.now_ms(), self.lease_ms))
    }

    fn advance(&mut self, ms: u64) -> Result<(), Self::Error> {
        self.clock.advance(Duration::from_millis(ms));
        Ok(())
    }

    fn now_ms(&mut self) -> Result<u64, Self::Error> {
        Ok(self.clock.now_ms())
    }

    fn set_budgets(&mut self, budgets: Budgets) -> Result<(), Self::Error> {
        self.gate.set_budgets(budgets, self.clock.now_ms());
        Ok(())
    }

    fn status(&mut self) -> Result<ModelStatus, Self::Error> {
        let (snapshot, in_flight, classes) = self.gate.status_with_classes(self.clock.now_ms());
        Ok(ModelStatus { state: snapshot.state, limit: snapshot.limit, wave: snapshot.wave, in_flight, classes })
    }

    fn report_window(
        &mut self,
        id: Option<&PermitId>,
        report: WindowReport,
        tokens_each: u64,
    ) -> Result<(), Self::Error> {
        self.gate.report_window(id.map_or("", PermitId::as_str), report, self.clock.now_ms(), tokens_each);
        Ok(())
    }
}

/// Every case of the specification, both twins: the wave machine's, then the classes'.
pub fn cases() -> Vec<SpecCase> {
    let mut cases = waves::cases();
    cases.extend(classes::cases());
    cases
}
