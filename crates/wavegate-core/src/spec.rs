//! The wave machine's executable specification: tables of steps and expected answers.
//!
//! Two implementations must agree: [`LocalGate`] (Rust, local mode) and the Lua scripts
//! (shared mode, in Redis). Each implements [`WaveModel`]; [`run_case`] drives one through a
//! [`SpecCase`] and reports the first step whose answer differs. The tables use short
//! durations (tens of milliseconds) with margins, so a model on a real clock (Redis `TIME`,
//! advanced by sleeping) passes them as well as one on a manual clock.
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

use crate::clock::{Clock, ManualClock};
use crate::cooldown::CooldownPolicy;
use crate::gate::{LocalGate, WaveSignal};
use crate::gcra::{Budgets, RateBudget};
use crate::learned_limit::{LearnedLimit, LearnedLimits};
use crate::provider_window::{WindowLeft, WindowReport};
use crate::wave::{Admission, DenyReason, Recovery, WaveConfig, WaveState};

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
    /// How the limit grows back.
    pub recovery: Recovery,
    /// [`Recovery::Adaptive`]'s re-test spacing, first and longest, in milliseconds.
    pub retest_ms: (u64, u64),
    /// The steps, in order.
    pub steps: Vec<Step>,
}

impl SpecCase {
    /// The rate budgets the case describes.
    pub fn budgets(&self) -> Budgets {
        let budget = |b: Option<(u32, u32)>| b.and_then(|(rate, burst)| RateBudget::new(rate, burst));
        Budgets { requests: budget(self.requests_per_minute), tokens: budget(self.tokens_per_minute) }
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
}

/// One step of a case.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Acquire the permit named `permit` and compare the answer.
    Acquire {
        /// The permit's name (models may prefix it to make a unique id).
        permit: &'static str,
        /// The tokens to reserve.
        tokens: u64,
        /// The expected answer.
        expect: Expect,
    },
    /// Finish `permit` with `signal`, tagged with the wave it was granted in (or `wave` when
    /// given, for a permit that was never granted); compare whether it was held.
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
    /// Refused because the limit is reached.
    DeniedAtLimit,
    /// Refused by the requests budget, with a wait in `(0, 60 s]`.
    DeniedRequests,
    /// Refused by the tokens budget, with a wait in `(0, 60 s]`.
    DeniedTokens,
    /// Refused: the estimate can never fit the tokens burst.
    DeniedTooLarge,
    /// Refused by a spent provider window, with a wait in `(0, max_ms]`.
    DeniedProviderWindow {
        /// The longest wait expected.
        max_ms: u64,
    },
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
}

impl SpecSignal {
    /// The signal as the gate takes it.
    pub fn to_wave_signal(self) -> WaveSignal {
        match self {
            SpecSignal::Success => WaveSignal::Success,
            SpecSignal::RateLimited(ms) => WaveSignal::RateLimited { retry_after: ms.map(Duration::from_millis) },
            SpecSignal::Neutral => WaveSignal::Neutral,
        }
    }
}

/// An implementation of the wave machine under test.
pub trait WaveModel {
    /// What can go wrong talking to it (I/O for the Redis model).
    type Error: fmt::Display;
    /// Acquires permit `permit` with the case's lease, reserving `tokens`.
    fn acquire(&mut self, permit: &str, tokens: u64) -> Result<Admission, Self::Error>;
    /// Finishes permit `permit`, tagged with `wave`, settling `token_delta`; returns whether it
    /// was held.
    fn finish(&mut self, permit: &str, wave: u64, signal: WaveSignal, token_delta: i64) -> Result<bool, Self::Error>;
    /// Lets `ms` milliseconds pass.
    fn advance(&mut self, ms: u64) -> Result<(), Self::Error>;
    /// The current state and number of permits held.
    fn status(&mut self) -> Result<ModelStatus, Self::Error>;
    /// Takes in what a response said is left of the provider's windows, `tokens_each` tokens
    /// reserved by the reporting call.
    fn report_window(&mut self, report: WindowReport, tokens_each: u64) -> Result<(), Self::Error>;
}

/// What a [`WaveModel`] reports of its state: the parts every implementation shares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ModelStatus {
    /// The state.
    pub state: WaveState,
    /// The current limit.
    pub limit: u32,
    /// The current wave id.
    pub wave: u64,
    /// Permits held.
    pub in_flight: usize,
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

/// Drives `model` through `case`; the first disagreement is the error.
pub fn run_case<M: WaveModel>(case: &SpecCase, model: &mut M) -> Result<(), SpecFailure> {
    let mut granted_in: HashMap<&str, u64> = HashMap::new();
    for (index, step) in case.steps.iter().enumerate() {
        let fail = |expected: String, got: String| SpecFailure { case: case.name, step: index, expected, got };
        let io = |e: M::Error| fail(format!("{step:?}"), format!("model error: {e}"));
        match step {
            Step::Acquire { permit, tokens, expect } => {
                let got = model.acquire(permit, *tokens).map_err(io)?;
                let waits = |reason: DenyReason, wait: u64| (reason, wait > 0 && wait <= 60_000);
                let matches = match (expect, got) {
                    (Expect::Granted { wave, state, limit }, Admission::Granted { wave: w, state: s, limit: l }) => {
                        (*wave, *state, *limit) == (w, s, l)
                    }
                    (Expect::DeniedCooldown, Admission::Denied { reason, retry_after_ms }) => {
                        reason == DenyReason::Cooldown && retry_after_ms > 0 && retry_after_ms <= case.max_cooldown_ms
                    }
                    (Expect::DeniedAtLimit, Admission::Denied { reason, .. }) => reason == DenyReason::AtLimit,
                    (Expect::DeniedRequests, Admission::Denied { reason, retry_after_ms }) => {
                        waits(reason, retry_after_ms) == (DenyReason::RequestBudget, true)
                    }
                    (Expect::DeniedTokens, Admission::Denied { reason, retry_after_ms }) => {
                        waits(reason, retry_after_ms) == (DenyReason::TokenBudget, true)
                    }
                    (Expect::DeniedTooLarge, Admission::Denied { reason, .. }) => {
                        reason == DenyReason::TokensExceedBurst
                    }
                    (Expect::DeniedProviderWindow { max_ms }, Admission::Denied { reason, retry_after_ms }) => {
                        reason == DenyReason::ProviderWindow && retry_after_ms > 0 && retry_after_ms <= *max_ms
                    }
                    _ => false,
                };
                if !matches {
                    return Err(fail(format!("acquire {permit}: {expect:?}"), format!("{got:?}")));
                }
                if let Admission::Granted { wave, .. } = got {
                    granted_in.insert(permit, wave);
                }
            }
            Step::Finish { permit, wave, signal, token_delta, held } => {
                let tag = wave.or_else(|| granted_in.get(permit).copied()).unwrap_or(0);
                let got = model.finish(permit, tag, signal.to_wave_signal(), *token_delta).map_err(io)?;
                if got != *held {
                    return Err(fail(format!("finish {permit}: held={held}"), format!("held={got}")));
                }
            }
            Step::Advance { ms } => model.advance(*ms).map_err(io)?,
            Step::ReportWindow { requests, tokens, tokens_each, learned_requests, learned_tokens } => {
                let left = |w: &Option<(u64, u64)>| w.map(|(remaining, reset_ms)| WindowLeft { remaining, reset_ms });
                let learned = |l: &Option<(u64, u64)>| l.map(|(limit, window_ms)| LearnedLimit { limit, window_ms });
                let limits = LearnedLimits { requests: learned(learned_requests), tokens: learned(learned_tokens) };
                let report = WindowReport { requests: left(requests), tokens: left(tokens), limits };
                model.report_window(report, *tokens_each).map_err(io)?;
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
    /// A fresh gate configured for `case`.
    pub fn new(case: &SpecCase) -> Self {
        Self {
            gate: LocalGate::with_budgets(case.wave_config(), case.budgets()),
            clock: ManualClock::new(1_000_000),
            lease_ms: case.lease_ms,
        }
    }
}

impl WaveModel for GateModel {
    type Error = std::convert::Infallible;

    fn acquire(&mut self, permit: &str, tokens: u64) -> Result<Admission, Self::Error> {
        Ok(self.gate.acquire_with(permit, self.clock.now_ms(), self.lease_ms, tokens))
    }

    fn finish(&mut self, permit: &str, wave: u64, signal: WaveSignal, token_delta: i64) -> Result<bool, Self::Error> {
        let now_ms = self.clock.now_ms();
        self.gate.settle_tokens(token_delta, now_ms);
        Ok(self.gate.finish_text(permit, wave, signal, now_ms).held)
    }

    fn advance(&mut self, ms: u64) -> Result<(), Self::Error> {
        self.clock.advance(Duration::from_millis(ms));
        Ok(())
    }

    fn status(&mut self) -> Result<ModelStatus, Self::Error> {
        let (snapshot, in_flight) = self.gate.status(self.clock.now_ms());
        Ok(ModelStatus { state: snapshot.state, limit: snapshot.limit, wave: snapshot.wave, in_flight })
    }

    fn report_window(&mut self, report: WindowReport, tokens_each: u64) -> Result<(), Self::Error> {
        self.gate.report_window("", report, self.clock.now_ms(), tokens_each);
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------
// The tables.

const LEASE_MS: u64 = 60_000;

fn granted(permit: &'static str, wave: u64, state: WaveState, limit: u32) -> Step {
    Step::Acquire { permit, tokens: 0, expect: Expect::Granted { wave, state, limit } }
}

fn denied_cooldown(permit: &'static str) -> Step {
    Step::Acquire { permit, tokens: 0, expect: Expect::DeniedCooldown }
}

fn denied_at_limit(permit: &'static str) -> Step {
    Step::Acquire { permit, tokens: 0, expect: Expect::DeniedAtLimit }
}

fn denied(permit: &'static str, tokens: u64, expect: Expect) -> Step {
    Step::Acquire { permit, tokens, expect }
}

fn with_tokens(permit: &'static str, tokens: u64) -> Step {
    Step::Acquire { permit, tokens, expect: Expect::Granted { wave: 1, state: WaveState::Normal, limit: 10 } }
}

fn finish(permit: &'static str, signal: SpecSignal) -> Step {
    Step::Finish { permit, wave: None, signal, token_delta: 0, held: true }
}

fn settle(permit: &'static str, token_delta: i64) -> Step {
    Step::Finish { permit, wave: None, signal: SpecSignal::Success, token_delta, held: true }
}

fn window(requests: Option<(u64, u64)>, tokens: Option<(u64, u64)>, tokens_each: u64) -> Step {
    Step::ReportWindow { requests, tokens, tokens_each, learned_requests: None, learned_tokens: None }
}

/// A response announcing limits only: `(limit, window in ms)` for requests and tokens.
fn learn(learned_requests: Option<(u64, u64)>, learned_tokens: Option<(u64, u64)>) -> Step {
    Step::ReportWindow { requests: None, tokens: None, tokens_each: 0, learned_requests, learned_tokens }
}

fn denied_window(permit: &'static str, tokens: u64, max_ms: u64) -> Step {
    Step::Acquire { permit, tokens, expect: Expect::DeniedProviderWindow { max_ms } }
}

fn status(state: WaveState, limit: u32, wave: u64, in_flight: usize) -> Step {
    Step::Status { state, limit, wave, in_flight }
}

const PERMITS: [&str; 16] =
    ["p0", "p1", "p2", "p3", "p4", "p5", "p6", "p7", "p8", "p9", "p10", "p11", "p12", "p13", "p14", "p15"];

/// `count` permits granted together in `state`, then all finished with success.
fn round(count: usize, wave: u64, state: WaveState, limit: u32) -> Vec<Step> {
    let mut steps: Vec<Step> = PERMITS[..count].iter().map(|p| granted(p, wave, state, limit)).collect();
    if count == limit as usize {
        steps.push(denied_at_limit("over"));
    }
    steps.extend(PERMITS[..count].iter().map(|p| finish(p, SpecSignal::Success)));
    steps
}

/// From PROBE at `wave` (limit 1), successes up to NORMAL at `base` = 10 with 3 probes.
fn recover_from_probe(wave: u64) -> Vec<Step> {
    let mut steps = Vec::new();
    for _ in 0..3 {
        steps.extend(round(1, wave, WaveState::Probe, 1));
    }
    steps.push(status(WaveState::Degraded, 2, wave, 0));
    steps.extend(round(2, wave, WaveState::Degraded, 2));
    steps.push(status(WaveState::Degraded, 4, wave, 0));
    steps.extend(round(4, wave, WaveState::Degraded, 4));
    steps.push(status(WaveState::Degraded, 8, wave, 0));
    steps.extend(round(8, wave, WaveState::Degraded, 8));
    steps.push(status(WaveState::Normal, 10, wave, 0));
    steps
}

fn case(name: &'static str, steps: Vec<Step>) -> SpecCase {
    SpecCase {
        name,
        base_limit: 10,
        probe_successes: 3,
        ladder_ms: vec![100, 200, 400, 600],
        min_cooldown_ms: 20,
        max_cooldown_ms: 1_000,
        lease_ms: LEASE_MS,
        requests_per_minute: None,
        tokens_per_minute: None,
        recovery: Recovery::Seed,
        retest_ms: (200, 800),
        steps,
    }
}

/// With permits `p0 .. p{n-1}` held in `wave` at limit `n`, each finishes with success and is
/// granted again at once, so the limit stays fully used: a round. The last grant sees the
/// limit the round left, `after`, in `state` (the others see `state` too when the limit stays,
/// DEGRADED when it grows).
fn busy_round(n: usize, wave: u64, state: WaveState, after: u32) -> Vec<Step> {
    let mut steps = Vec::new();
    for (i, permit) in PERMITS[..n].iter().enumerate() {
        steps.push(finish(permit, SpecSignal::Success));
        let during = if after == n as u32 { state } else { WaveState::Degraded };
        let (state, limit) = if i + 1 == n { (state, after) } else { (during, n as u32) };
        steps.push(granted(permit, wave, state, limit));
    }
    steps
}

/// Every case of the specification.
pub fn cases() -> Vec<SpecCase> {
    use SpecSignal::{Neutral, RateLimited, Success};
    use WaveState::{Cooldown, Degraded, Normal, Probe};

    let mut walkthrough = vec![
        // 1. A and B get permits in wave 1.
        granted("A", 1, Normal, 10),
        granted("B", 1, Normal, 10),
        // 2. A gets 429: limit 10 → 5, wave 2, COOLDOWN.
        finish("A", RateLimited(None)),
        status(Cooldown, 5, 2, 1),
        // 3. B's 429 arrives late, still tagged wave 1: no further cut.
        finish("B", RateLimited(None)),
        status(Cooldown, 5, 2, 0),
        denied_cooldown("C"),
        Step::Advance { ms: 50 },
        denied_cooldown("C"),
        // 4. The cooldown (100 ms, the first ladder step) ends: PROBE at limit 1.
        Step::Advance { ms: 60 },
        status(Probe, 1, 2, 0),
    ];
    walkthrough.extend(recover_from_probe(2));

    let mut ladder = vec![
        granted("A", 1, Normal, 10),
        finish("A", RateLimited(None)),
        Step::Advance { ms: 110 },
        // 5. A 429 in PROBE starts a new wave, one ladder step up (200 ms).
        granted("B", 2, Probe, 1),
        finish("B", RateLimited(None)),
        status(Cooldown, 1, 3, 0),
        Step::Advance { ms: 150 },
        denied_cooldown("C"),
        Step::Advance { ms: 60 },
    ];
    for _ in 0..3 {
        ladder.extend(round(1, 3, Probe, 1));
    }
    ladder.extend([
        // A 429 in DEGRADED: wave 4, the third step (400 ms), limit 2 → 1.
        granted("D", 3, Degraded, 2),
        finish("D", RateLimited(None)),
        status(Cooldown, 1, 4, 0),
        Step::Advance { ms: 350 },
        denied_cooldown("E"),
        Step::Advance { ms: 60 },
        status(Probe, 1, 4, 0),
    ]);
    ladder.extend(recover_from_probe(4));
    // Back in NORMAL the ladder starts again from its first step (100 ms).
    ladder.extend([
        granted("F", 4, Normal, 10),
        finish("F", RateLimited(None)),
        status(Cooldown, 5, 5, 0),
        Step::Advance { ms: 110 },
        status(Probe, 1, 5, 0),
    ]);

    vec![
        case("seed walk-through: 10 → 5 → PROBE 1 → 2 → 4 → 8 → 10", walkthrough),
        case("cooldown ladder climbs per wave before NORMAL and resets in NORMAL", ladder),
        case(
            "Retry-After comes first, clamped to [min, max]",
            vec![
                granted("A", 1, Normal, 10),
                finish("A", RateLimited(Some(300))),
                Step::Advance { ms: 250 },
                denied_cooldown("B"),
                Step::Advance { ms: 60 },
                granted("B", 2, Probe, 1),
                finish("B", RateLimited(Some(0))),
                status(Cooldown, 1, 3, 0),
                Step::Advance { ms: 25 },
                granted("C", 3, Probe, 1),
                finish("C", RateLimited(Some(86_400_000))),
                Step::Advance { ms: 900 },
                denied_cooldown("D"),
                Step::Advance { ms: 110 },
                granted("D", 4, Probe, 1),
            ],
        ),
        case(
            "only successes of the current wave count towards recovery",
            vec![
                granted("old", 1, Normal, 10),
                granted("A", 1, Normal, 10),
                finish("A", RateLimited(None)),
                Step::Advance { ms: 110 },
                status(Probe, 1, 2, 1),
                // The old wave's call still holds its permit, so PROBE has no room yet.
                denied_at_limit("B"),
                finish("old", Success),
                granted("B", 2, Probe, 1),
                finish("B", Success),
                granted("C", 2, Probe, 1),
                finish("C", Success),
                status(Probe, 1, 2, 0),
                granted("D", 2, Probe, 1),
                finish("D", Success),
                status(Degraded, 2, 2, 0),
            ],
        ),
        case(
            "a late 429 from an older wave cuts nothing in any state",
            vec![
                granted("A", 1, Normal, 10),
                granted("B", 1, Normal, 10),
                granted("C", 1, Normal, 10),
                finish("A", RateLimited(None)),
                finish("B", RateLimited(None)),
                status(Cooldown, 5, 2, 1),
                Step::Advance { ms: 110 },
                status(Probe, 1, 2, 1),
                finish("C", RateLimited(Some(500))),
                status(Probe, 1, 2, 0),
                granted("P", 2, Probe, 1),
                Step::Finish { permit: "P", wave: Some(1), signal: RateLimited(None), token_delta: 0, held: true },
                status(Probe, 1, 2, 0),
            ],
        ),
        case(
            "limits, neutral outcomes and idempotent ids",
            vec![
                granted("A", 1, Normal, 10),
                // A resent acquire (its reply was lost) is the same permit.
                granted("A", 1, Normal, 10),
                status(Normal, 10, 1, 1),
                Step::Finish { permit: "ghost", wave: Some(1), signal: Neutral, token_delta: 0, held: false },
                finish("A", Neutral),
                Step::Finish { permit: "A", wave: None, signal: Neutral, token_delta: 0, held: false },
                status(Normal, 10, 1, 0),
            ]
            .into_iter()
            .chain((0..10).map(|i| granted(PERMITS[i], 1, Normal, 10)))
            .chain([denied_at_limit("K"), finish("p3", Neutral), granted("K", 1, Normal, 10), denied_at_limit("L")])
            .collect(),
        ),
        SpecCase {
            lease_ms: 100,
            ..case(
                "an expired lease frees its permit, and its late report still counts",
                vec![
                    granted("A", 1, Normal, 10),
                    Step::Advance { ms: 60 },
                    status(Normal, 10, 1, 1),
                    Step::Advance { ms: 60 },
                    status(Normal, 10, 1, 0),
                    Step::Finish { permit: "A", wave: None, signal: RateLimited(None), token_delta: 0, held: false },
                    status(Cooldown, 5, 2, 0),
                ],
            )
        },
        SpecCase {
            requests_per_minute: Some((600, 2)),
            ..case(
                "requests per minute: a burst, then one per interval, with the exact wait",
                vec![
                    with_tokens("A", 0),
                    with_tokens("B", 0),
                    denied("C", 0, Expect::DeniedRequests),
                    finish("A", Success),
                    // Releasing a permit gives back concurrency, not the request budget.
                    denied("C", 0, Expect::DeniedRequests),
                    Step::Advance { ms: 50 },
                    denied("C", 0, Expect::DeniedRequests),
                    Step::Advance { ms: 60 },
                    with_tokens("C", 0),
                    denied("D", 0, Expect::DeniedRequests),
                    Step::Advance { ms: 110 },
                    with_tokens("D", 0),
                ],
            )
        },
        SpecCase {
            requests_per_minute: Some((600, 2)),
            base_limit: 1,
            ..case(
                "budgets are charged only when everything admits, and never twice for one id",
                vec![
                    granted("A", 1, Normal, 1),
                    granted("A", 1, Normal, 1),
                    denied_at_limit("B"),
                    denied_at_limit("B"),
                    denied_at_limit("B"),
                    finish("A", Success),
                    granted("B", 1, Normal, 1),
                    finish("B", Success),
                    denied("C", 0, Expect::DeniedRequests),
                ],
            )
        },
        SpecCase {
            tokens_per_minute: Some((60_000, 1_000)),
            ..case(
                "tokens: reserved at acquire, refunded or charged extra when settled",
                vec![
                    with_tokens("A", 800),
                    denied("B", 300, Expect::DeniedTokens),
                    // A used 300 of its 800: 500 come back.
                    settle("A", -500),
                    with_tokens("B", 300),
                    denied("C", 500, Expect::DeniedTokens),
                    // B used 500 of its 300: 200 more are charged.
                    settle("B", 200),
                    denied("C", 500, Expect::DeniedTokens),
                    denied("D", 1_001, Expect::DeniedTooLarge),
                    Step::Advance { ms: 320 },
                    with_tokens("C", 500),
                ],
            )
        },
        SpecCase {
            tokens_per_minute: Some((60_000, 1_000)),
            base_limit: 1,
            ..case(
                "tokens: an estimate that can never fit is refused before the limit and the cooldown",
                vec![
                    granted("A", 1, Normal, 1),
                    // At the limit: still refused as too large, not told to wait.
                    denied("B", 1_001, Expect::DeniedTooLarge),
                    finish("A", RateLimited(None)),
                    status(Cooldown, 1, 2, 0),
                    // In a cooldown: the same.
                    denied("B", 1_001, Expect::DeniedTooLarge),
                    denied_cooldown("C"),
                    status(Cooldown, 1, 2, 0),
                ],
            )
        },
        SpecCase {
            base_limit: 4,
            recovery: Recovery::Adaptive,
            ..case(
                "adaptive: the first 429 halves the limit and stops nobody; a 429 before any success there stops all",
                vec![
                    granted("A", 1, Normal, 4),
                    granted("B", 1, Normal, 4),
                    // Nothing held yet: step back by half, a new wave, no cooldown.
                    finish("A", RateLimited(None)),
                    status(Degraded, 2, 2, 1),
                    // The same burst's 429 is late.
                    finish("B", RateLimited(Some(50))),
                    status(Degraded, 2, 2, 0),
                    granted("C", 2, Degraded, 2),
                    granted("D", 2, Degraded, 2),
                    denied_at_limit("E"),
                    // A 429 at the stepped-back limit before any call succeeded there: a burst,
                    // so the fleet stops for the provider's Retry-After (300 ms).
                    finish("C", RateLimited(Some(300))),
                    status(Cooldown, 1, 3, 1),
                    denied_cooldown("E"),
                    Step::Advance { ms: 250 },
                    denied_cooldown("E"),
                    finish("D", Success),
                    Step::Advance { ms: 60 },
                    status(Probe, 1, 3, 0),
                ],
            )
        },
        SpecCase {
            base_limit: 8,
            recovery: Recovery::Adaptive,
            ..case("adaptive: back to what held, re-tests spaced and backed off, a 429 at what held stops all", {
                let mut steps: Vec<Step> = PERMITS[..8].iter().map(|p| granted(p, 1, Normal, 8)).collect();
                // 8 is too many: half (nothing held yet), threshold 4, ceiling 8, re-test in 200 ms.
                steps.push(finish("p0", RateLimited(None)));
                steps.push(status(Degraded, 4, 2, 7));
                steps.extend(PERMITS[1..8].iter().map(|p| finish(p, Neutral)));
                steps.extend(PERMITS[..4].iter().map(|p| granted(p, 2, Degraded, 4)));
                steps.push(denied_at_limit("over"));
                // Fully used rounds: 4, 5 and 6 hold; growth by one from the threshold.
                steps.extend(busy_round(4, 2, Degraded, 5));
                steps.push(granted("p4", 2, Degraded, 5));
                steps.extend(busy_round(5, 2, Degraded, 6));
                steps.push(granted("p5", 2, Degraded, 6));
                steps.extend(busy_round(6, 2, Degraded, 7));
                steps.push(granted("p6", 2, Degraded, 7));
                // One below the ceiling, before its re-test time: held at 7.
                steps.extend(busy_round(7, 2, Degraded, 7));
                steps.push(status(Degraded, 7, 2, 7));
                steps.push(Step::Advance { ms: 210 });
                // Re-test time: 8 is tried (the base: NORMAL, the ceiling still remembered).
                steps.extend(busy_round(7, 2, Normal, 8));
                steps.push(granted("p7", 2, Normal, 8));
                // The test fails: back to 7, what held; no cooldown; spacing doubled (400 ms).
                steps.push(finish("p7", RateLimited(Some(50))));
                steps.push(status(Degraded, 7, 3, 7));
                steps.push(denied_at_limit("over"));
                // The calls of wave 2 end; wave 3's take their places.
                for permit in &PERMITS[..7] {
                    steps.push(finish(permit, Neutral));
                    steps.push(granted(permit, 3, Degraded, 7));
                }
                steps.extend(busy_round(7, 3, Degraded, 7));
                steps.push(Step::Advance { ms: 210 });
                steps.extend(busy_round(7, 3, Degraded, 7));
                steps.push(Step::Advance { ms: 200 });
                steps.extend(busy_round(7, 3, Normal, 8));
                steps.push(granted("p7", 3, Normal, 8));
                // 8 holds a fully used round: what held is 8, the ceiling forgotten.
                steps.extend(busy_round(8, 3, Normal, 8));
                // A 429 at a limit that held: the provider says wait; everyone stops.
                steps.push(finish("p0", RateLimited(None)));
                steps.push(status(Cooldown, 4, 4, 7));
                steps.push(denied_cooldown("over"));
                steps
            })
        },
        SpecCase {
            base_limit: 1,
            ..case(
                "limit 1 stays 1 through a cut and recovers straight to NORMAL",
                vec![
                    granted("A", 1, Normal, 1),
                    denied_at_limit("B"),
                    finish("A", RateLimited(None)),
                    status(Cooldown, 1, 2, 0),
                    Step::Advance { ms: 110 },
                    granted("B", 2, Probe, 1),
                    finish("B", Success),
                    granted("C", 2, Probe, 1),
                    finish("C", Success),
                    granted("D", 2, Probe, 1),
                    finish("D", Success),
                    status(Normal, 1, 2, 0),
                ],
            )
        },
        case(
            "provider window: 0 left until T pauses every grant until T, and cuts nothing",
            vec![
                granted("A", 1, Normal, 10),
                finish("A", Success),
                window(Some((0, 300)), None, 0),
                denied_window("B", 0, 300),
                status(Normal, 10, 1, 0),
                Step::Advance { ms: 350 },
                granted("B", 1, Normal, 10),
                status(Normal, 10, 1, 1),
            ],
        ),
        case(
            "provider window: what is left counts the calls in flight and each grant",
            vec![
                granted("A", 1, Normal, 10),
                granted("B", 1, Normal, 10),
                finish("A", Success),
                // 2 left, B still in flight and maybe not counted yet: 1 may go.
                window(Some((2, 400)), None, 0),
                granted("C", 1, Normal, 10),
                denied_window("D", 0, 400),
                Step::Advance { ms: 450 },
                granted("D", 1, Normal, 10),
            ],
        ),
        case(
            "provider window: an older answer of the same window never raises what is left",
            vec![
                window(Some((1, 400)), None, 0),
                window(Some((5, 350)), None, 0),
                granted("A", 1, Normal, 10),
                denied_window("B", 0, 400),
                // A later window replaces it.
                window(Some((3, 5_000)), None, 0),
                granted("B", 1, Normal, 10),
            ],
        ),
        case(
            "provider window: tokens are counted with the estimate; a spent one refuses every grant",
            vec![
                granted("A", 1, Normal, 10),
                finish("A", Success),
                window(None, Some((100, 300)), 0),
                with_tokens("B", 60),
                denied_window("C", 60, 300),
                with_tokens("C", 40),
                denied_window("D", 0, 300),
                Step::Advance { ms: 350 },
                with_tokens("D", 60),
            ],
        ),
        SpecCase {
            requests_per_minute: Some((6_000, 4)),
            ..case(
                "learned limit: a limit announced with its window tightens the configured budget",
                vec![
                    // 2 per 200 ms: 600 a minute, bursts of 2, under 6,000 a minute with bursts of 4.
                    learn(Some((2, 200)), None),
                    with_tokens("A", 0),
                    with_tokens("B", 0),
                    denied("C", 0, Expect::DeniedRequests),
                    Step::Advance { ms: 120 },
                    with_tokens("C", 0),
                    denied("D", 0, Expect::DeniedRequests),
                ],
            )
        },
        SpecCase {
            requests_per_minute: Some((600, 2)),
            ..case(
                "learned limit: a looser announced limit never loosens the configured budget",
                vec![
                    // 100 per second: 6,000 a minute, bursts of 100; the configuration stays.
                    learn(Some((100, 1_000)), None),
                    with_tokens("A", 0),
                    with_tokens("B", 0),
                    denied("C", 0, Expect::DeniedRequests),
                    Step::Advance { ms: 50 },
                    denied("C", 0, Expect::DeniedRequests),
                    Step::Advance { ms: 60 },
                    with_tokens("C", 0),
                ],
            )
        },
        case(
            "learned limit: without a configured budget it is the budget, forgotten three windows after its report",
            vec![
                // 2 per 100 ms: one per 50 ms, bursts of 2, kept 300 ms.
                learn(Some((2, 100)), None),
                with_tokens("A", 0),
                with_tokens("B", 0),
                denied("C", 0, Expect::DeniedRequests),
                Step::Advance { ms: 60 },
                with_tokens("C", 0),
                denied("D", 0, Expect::DeniedRequests),
                Step::Advance { ms: 350 },
                // Forgotten: no budget any more.
                with_tokens("D", 0),
                with_tokens("E", 0),
                with_tokens("F", 0),
            ],
        ),
        case(
            "learned limit: a tokens limit sets the burst an estimate must fit; a later announcement replaces it",
            vec![
                // 1,000 tokens per second.
                learn(None, Some((1_000, 1_000))),
                denied("A", 1_001, Expect::DeniedTooLarge),
                with_tokens("A", 800),
                denied("B", 300, Expect::DeniedTokens),
                // The provider raised it (a new tier): 10,000 per second.
                learn(None, Some((10_000, 1_000))),
                with_tokens("B", 300),
            ],
        ),
    ]
}
