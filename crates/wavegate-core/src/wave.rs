//! The 429 wave state machine, shared by every process that calls one upstream.
//!
//! States: NORMAL → (429) → COOLDOWN → (deadline) → PROBE → (successes) → DEGRADED → NORMAL.
//!
//! * Every permit carries the **wave id** it was issued in. A 429 reported for the current
//!   wave halves the limit, starts wave + 1 and a COOLDOWN during which nothing is admitted.
//!   A 429 tagged with an older wave arrives late from the same burst and changes nothing, so
//!   one failure burst cuts the limit once.
//! * When the cooldown ends the state is PROBE with limit 1. After
//!   [`probe_successes`](WaveConfig::probe_successes) consecutive successes it is DEGRADED at
//!   limit 2, and the limit doubles each time as many consecutive successes as the current
//!   limit have been seen (2 at 2, 4 at 4, ...), capped at the base limit, where it is NORMAL.
//! * A 429 in PROBE or DEGRADED starts a new wave and a new cooldown, one step further up the
//!   cooldown ladder; the ladder starts again from the bottom once NORMAL is reached.
//! * Only successes of permits issued in the current wave count towards recovery: a call that
//!   started before the cut says nothing about the provider after it.
//!
//! [`Recovery::Adaptive`] (the default) keeps this skeleton but lets a 429 above the last
//! limit that held step the limit back without a cooldown; see its documentation.
//!
//! The same machine runs in Lua (shared mode, inside Redis) and here (local mode); both are
//! checked against the tables in `wavegate_core::spec` (the `spec` feature) and against each other on random
//! sequences (`crates/wavegate-redis/tests/twins.rs`).
//!
//! ```
//! use std::num::NonZeroU32;
//! use std::time::Duration;
//! use wavegate_core::{Admission, Recovery, WaveConfig, WaveMachine, WaveState};
//!
//! let mut config = WaveConfig::new(NonZeroU32::new(10).unwrap());
//! config.recovery = Recovery::Seed; // the seed's walk-through; see Recovery::Adaptive
//! let mut wave = WaveMachine::new(config);
//! let Admission::Granted { wave: w, .. } = wave.admit(0, 0) else { panic!() };
//! wave.on_rate_limited(w, 0, None); // 10 → 5, COOLDOWN for 5 s
//! wave.on_rate_limited(w, 0, None); // the same burst: ignored
//! assert_eq!((wave.snapshot().state, wave.snapshot().limit), (WaveState::Cooldown, 5));
//! assert!(matches!(wave.admit(4_999, 0), Admission::Denied { .. }));
//! assert!(matches!(wave.admit(5_000, 0), Admission::Granted { limit: 1, .. }));
//! ```

use std::fmt;
use std::num::NonZeroU32;
use std::time::Duration;

use crate::clock::duration_ms;
use crate::cooldown::CooldownPolicy;

/// One of the four states of an upstream's wave.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize), serde(rename_all = "SCREAMING_SNAKE_CASE"))]
pub enum WaveState {
    /// Full limit; no recent 429.
    Normal,
    /// After a 429: nothing is admitted until the cooldown deadline.
    Cooldown,
    /// After a cooldown: limit 1 until enough consecutive successes.
    Probe,
    /// Recovering: the limit doubles on each success condition up to the base limit.
    Degraded,
}

impl WaveState {
    /// The state's name as stored in Redis and shown in metrics: `NORMAL`, `COOLDOWN`, ...
    pub const fn as_str(self) -> &'static str {
        match self {
            WaveState::Normal => "NORMAL",
            WaveState::Cooldown => "COOLDOWN",
            WaveState::Probe => "PROBE",
            WaveState::Degraded => "DEGRADED",
        }
    }

    /// Parses a name written by [`as_str`](Self::as_str).
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "NORMAL" => Some(WaveState::Normal),
            "COOLDOWN" => Some(WaveState::Cooldown),
            "PROBE" => Some(WaveState::Probe),
            "DEGRADED" => Some(WaveState::Degraded),
            _ => None,
        }
    }
}

impl fmt::Display for WaveState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How the limit grows back after a cut.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum Recovery {
    /// Exactly as the seed walks it: every 429 of the current wave halves the limit and stops
    /// the fleet for a cooldown; PROBE 1, then DEGRADED doubling 2 → 4 → 8 → … → base, each
    /// after as many successes as the limit. A provider whose real capacity is below the
    /// configured limit is hit again at every cycle.
    Seed,
    /// Learns a hidden capacity without stopping the fleet (the default).
    ///
    /// * A **step back**: a 429 above the last limit that held (a test of more capacity, or
    ///   the first 429 ever) lowers the limit — to the last limit that held, or by half when
    ///   none is known — and starts a new wave, but no cooldown: the rejected call alone waits
    ///   its `Retry-After` and retries through a new permit.
    /// * A **stop**: a 429 at or below the last limit that held, a 429 before any call
    ///   succeeded at a limit just stepped back to (a burst), or one in PROBE halves the
    ///   limit and stops the whole fleet for the cooldown (`Retry-After` or the ladder), as
    ///   the seed does: the provider says "everyone wait" (a rate window, a capacity that fell).
    /// * Growth: slow start (doubling) up to the threshold the last cut left, then by one;
    ///   a success counts only while the limit is used (in flight × 2 ≥ limit); a limit
    ///   "holds" once as many successes as the limit were seen with it fully used.
    /// * Re-tests: after a step back the limit that drew the 429 (the ceiling) is tried
    ///   again no sooner than [`retest_after`](WaveConfig::retest_after) later and after at
    ///   least one round at the limit below; each failed test doubles both, up to
    ///   [`retest_max`](WaveConfig::retest_max) and
    ///   [`retest_rounds_max`](WaveConfig::retest_rounds_max) rounds: capacity changes slowly,
    ///   and each test costs one 429 of one call — at most one per that many seconds and one
    ///   per that many rounds of calls, for short and long calls alike.
    #[default]
    Adaptive,
}

impl Recovery {
    /// `seed` or `adaptive`, as the Lua scripts take it.
    pub const fn as_str(self) -> &'static str {
        match self {
            Recovery::Seed => "seed",
            Recovery::Adaptive => "adaptive",
        }
    }
}

/// The parameters of one upstream's wave machine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WaveConfig {
    /// The limit in NORMAL (the configured concurrency limit).
    pub base_limit: NonZeroU32,
    /// Consecutive successes needed to leave PROBE. Default 3.
    pub probe_successes: NonZeroU32,
    /// Cooldown lengths.
    pub cooldown: CooldownPolicy,
    /// How the limit grows back. Default [`Recovery::Adaptive`].
    pub recovery: Recovery,
    /// [`Recovery::Adaptive`]: how long after a step back the limit that drew the 429 may be
    /// tested again. Default 1 s.
    pub retest_after: Duration,
    /// [`Recovery::Adaptive`]: the longest spacing between tests, which doubles after each
    /// failed one. Default 8 s: a capacity that grew is found within about that.
    pub retest_max: Duration,
    /// [`Recovery::Adaptive`]: the most rounds (as many successes as the limit) held between
    /// tests, which double from 1 after each failed one. Default 32, so that with long calls a
    /// test is at most one call in 32 × the limit.
    pub retest_rounds_max: u32,
}

impl WaveConfig {
    /// Default probe successes (3).
    pub const DEFAULT_PROBE_SUCCESSES: NonZeroU32 = NonZeroU32::new(3).expect("3 is not zero");
    /// Default spacing of the first re-test after a step back (1 s).
    pub const DEFAULT_RETEST_AFTER: Duration = Duration::from_secs(1);
    /// Default longest spacing between re-tests (8 s).
    pub const DEFAULT_RETEST_MAX: Duration = Duration::from_secs(8);
    /// Default most rounds held between re-tests (32).
    pub const DEFAULT_RETEST_ROUNDS_MAX: u32 = 32;

    /// The defaults around `base_limit`: 3 probe successes, the default cooldown ladder.
    pub fn new(base_limit: NonZeroU32) -> Self {
        Self {
            base_limit,
            probe_successes: Self::DEFAULT_PROBE_SUCCESSES,
            cooldown: CooldownPolicy::default(),
            recovery: Recovery::default(),
            retest_after: Self::DEFAULT_RETEST_AFTER,
            retest_max: Self::DEFAULT_RETEST_MAX,
            retest_rounds_max: Self::DEFAULT_RETEST_ROUNDS_MAX,
        }
    }
}

/// Everything the machine knows, as stored next to the permits in Redis.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WaveSnapshot {
    /// The current state.
    pub state: WaveState,
    /// The current concurrency limit, in `[1, base]`.
    pub limit: u32,
    /// The current wave id; starts at 1 and only grows.
    pub wave: u64,
    /// When the cooldown ends (meaningful in COOLDOWN), in clock milliseconds.
    pub cooldown_until_ms: u64,
    /// Consecutive successes counted towards the next recovery step.
    pub successes: u32,
    /// The cooldown ladder step of the current wave (0 for a wave that started in NORMAL).
    pub step: u32,
    /// The limit the last cut left (the halved limit), kept for recovery policies.
    pub threshold: u32,
    /// [`Recovery::Adaptive`]: the limit that drew the last step back, 0 when none is
    /// remembered; growth stops one below it until `retest_at_ms`.
    pub ceiling: u32,
    /// [`Recovery::Adaptive`]: the highest limit that held (a full round of successes with
    /// it fully used) since the last stop, 0 when none.
    pub good: u32,
    /// [`Recovery::Adaptive`]: when the ceiling may be tested again, in clock milliseconds.
    pub retest_at_ms: u64,
    /// [`Recovery::Adaptive`]: the current spacing between tests, in milliseconds (0: none
    /// failed since the last stop).
    pub spacing_ms: u64,
    /// [`Recovery::Adaptive`]: rounds completed since the last step back (saturating).
    pub rounds: u32,
    /// [`Recovery::Adaptive`]: the rounds needed before the next test (0: none failed).
    pub retest_rounds: u32,
    /// [`Recovery::Adaptive`]: the limit was just stepped back and no call of this wave has
    /// succeeded yet; a 429 now is a burst and stops the fleet.
    pub on_trial: bool,
}

impl WaveSnapshot {
    /// `state` at `limit` in wave `wave`, with nothing else remembered (no cooldown, no count
    /// of successes, no ceiling, no re-test): a fresh machine, or a state carried elsewhere.
    pub const fn bare(state: WaveState, limit: u32, wave: u64) -> Self {
        Self {
            state,
            limit,
            wave,
            cooldown_until_ms: 0,
            successes: 0,
            step: 0,
            threshold: limit,
            ceiling: 0,
            good: 0,
            retest_at_ms: 0,
            spacing_ms: 0,
            rounds: 0,
            retest_rounds: 0,
            on_trial: false,
        }
    }
}

/// The answer to "may one more permit be issued now?".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// Yes: the permit belongs to `wave`.
    Granted {
        /// The wave the permit is issued in; report its outcome with this id.
        wave: u64,
        /// The state at the moment of the grant.
        state: WaveState,
        /// The limit at the moment of the grant.
        limit: u32,
    },
    /// No.
    Denied {
        /// Why not.
        reason: DenyReason,
        /// How long until asking again can succeed: the rest of the cooldown, or zero when
        /// only a release can make room. Relative, so it means the same whichever clock
        /// (Redis `TIME` or the process's) decided.
        retry_after_ms: u64,
    },
}

/// Why a permit was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum DenyReason {
    /// The upstream is cooling down after a 429.
    Cooldown,
    /// As many permits as the current limit are in flight.
    AtLimit,
    /// The requests-per-minute budget is spent until `retry_after_ms`.
    RequestBudget,
    /// The tokens-per-minute budget is spent until `retry_after_ms`.
    TokenBudget,
    /// The token estimate is larger than the tokens-per-minute burst: it can never fit.
    TokensExceedBurst,
    /// The provider said its requests or tokens window is spent until `retry_after_ms`
    /// (see [`ProviderWindows`](crate::ProviderWindows)).
    ProviderWindow,
    /// The rate budgets (or the provider's window) have room, but a waiter of another process
    /// was refused for that room first: it is served first, this ask waits until
    /// `retry_after_ms` (see [`BudgetTurn`](crate::BudgetTurn)).
    EarlierWaiter,
}

impl DenyReason {
    /// A stable lower-case name (`cooldown`, `at_limit`, `requests`, `tokens`,
    /// `tokens_exceed_burst`, `provider_window`, `earlier_waiter`), as the Lua scripts return
    /// it.
    pub const fn as_str(self) -> &'static str {
        match self {
            DenyReason::Cooldown => "cooldown",
            DenyReason::AtLimit => "at_limit",
            DenyReason::RequestBudget => "requests",
            DenyReason::TokenBudget => "tokens",
            DenyReason::TokensExceedBurst => "tokens_exceed_burst",
            DenyReason::ProviderWindow => "provider_window",
            DenyReason::EarlierWaiter => "earlier_waiter",
        }
    }

    /// Parses a name written by [`as_str`](Self::as_str).
    pub fn parse(name: &str) -> Option<Self> {
        [
            Self::Cooldown,
            Self::AtLimit,
            Self::RequestBudget,
            Self::TokenBudget,
            Self::TokensExceedBurst,
            Self::ProviderWindow,
            Self::EarlierWaiter,
        ]
        .into_iter()
        .find(|reason| reason.as_str() == name)
    }
}

/// What a reported 429 did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RateLimitEffect {
    /// It started a new wave: the limit was cut and a cooldown began.
    Cut {
        /// The limit before the cut.
        from: u32,
        /// The limit after the cut.
        to: u32,
        /// The new wave id.
        wave: u64,
        /// How long the cooldown lasts from the report.
        cooldown: Duration,
    },
    /// It belonged to an older wave that was already cut: nothing changed.
    Late {
        /// The wave the 429 was tagged with.
        reported: u64,
        /// The current wave.
        current: u64,
    },
}

/// A change of state, for logs and metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transition {
    /// The state before.
    pub from: WaveState,
    /// The state after.
    pub to: WaveState,
    /// The limit after.
    pub limit: u32,
}

/// The wave state machine of one upstream. Pure: time comes in as milliseconds.
#[derive(Debug, Clone)]
pub struct WaveMachine {
    config: WaveConfig,
    snapshot: WaveSnapshot,
}

impl WaveMachine {
    /// A machine in NORMAL at the base limit, wave 1.
    pub fn new(config: WaveConfig) -> Self {
        let base = config.base_limit.get();
        Self { config, snapshot: WaveSnapshot::bare(WaveState::Normal, base, 1) }
    }

    /// The machine's configuration.
    pub fn config(&self) -> &WaveConfig {
        &self.config
    }

    /// The current state, as last updated (call [`poll`](Self::poll) first to apply time).
    pub fn snapshot(&self) -> WaveSnapshot {
        self.snapshot
    }

    /// Applies the passage of time: a COOLDOWN whose deadline has passed becomes PROBE.
    pub fn poll(&mut self, now_ms: u64) -> Option<Transition> {
        let s = &mut self.snapshot;
        if s.state == WaveState::Cooldown && now_ms >= s.cooldown_until_ms {
            s.successes = 0;
            s.state = WaveState::Probe;
            s.limit = 1;
            return Some(Transition { from: WaveState::Cooldown, to: s.state, limit: s.limit });
        }
        None
    }

    /// Decides whether one more permit may be issued with `in_flight` permits held.
    pub fn admit(&mut self, now_ms: u64, in_flight: u32) -> Admission {
        self.poll(now_ms);
        let s = &self.snapshot;
        if s.state == WaveState::Cooldown {
            return Admission::Denied {
                reason: DenyReason::Cooldown,
                retry_after_ms: s.cooldown_until_ms.saturating_sub(now_ms),
            };
        }
        if in_flight >= s.limit {
            return Admission::Denied { reason: DenyReason::AtLimit, retry_after_ms: 0 };
        }
        Admission::Granted { wave: s.wave, state: s.state, limit: s.limit }
    }

    /// Records a successful call of a permit issued in `wave` at `now_ms`, with `in_flight`
    /// permits held at the report (the reporting one included; only [`Recovery::Adaptive`]
    /// uses them).
    pub fn on_success(&mut self, wave: u64, in_flight: u32, now_ms: u64) -> Option<Transition> {
        if self.config.recovery == Recovery::Adaptive
            && matches!(self.snapshot.state, WaveState::Normal | WaveState::Degraded)
        {
            return self.adaptive_success(wave, in_flight, now_ms);
        }
        let base = self.config.base_limit.get();
        let probe_successes = self.config.probe_successes.get();
        let s = &mut self.snapshot;
        if wave != s.wave {
            return None;
        }
        match s.state {
            WaveState::Normal | WaveState::Cooldown => None,
            WaveState::Probe => {
                s.successes += 1;
                if s.successes < probe_successes {
                    return None;
                }
                s.successes = 0;
                s.limit = 2.min(base);
                s.state = if s.limit >= base { WaveState::Normal } else { WaveState::Degraded };
                if s.state == WaveState::Normal {
                    s.step = 0;
                }
                Some(Transition { from: WaveState::Probe, to: s.state, limit: s.limit })
            }
            WaveState::Degraded => {
                s.successes += 1;
                if s.successes < s.limit {
                    return None;
                }
                s.successes = 0;
                s.limit = s.limit.saturating_mul(2).min(base);
                if s.limit < base {
                    // Still degraded: a transition of the limit only.
                    return Some(Transition { from: WaveState::Degraded, to: WaveState::Degraded, limit: s.limit });
                }
                s.state = WaveState::Normal;
                s.step = 0;
                Some(Transition { from: WaveState::Degraded, to: WaveState::Normal, limit: s.limit })
            }
        }
    }

    /// [`Recovery::Adaptive`] in NORMAL or DEGRADED: what held, slow start, growth only when
    /// used, the ceiling and its re-tests.
    fn adaptive_success(&mut self, wave: u64, in_flight: u32, now_ms: u64) -> Option<Transition> {
        let base = self.config.base_limit.get();
        let s = &mut self.snapshot;
        if wave != s.wave {
            return None;
        }
        s.on_trial = false;
        if in_flight.saturating_mul(2) < s.limit {
            return None;
        }
        s.successes += 1;
        if s.successes < s.limit {
            return None;
        }
        // A round: as many successes as the limit, while it was used.
        s.successes = 0;
        s.rounds = s.rounds.saturating_add(1);
        if in_flight >= s.limit {
            // It held, fully used.
            s.good = s.good.max(s.limit);
        }
        if s.ceiling > 0 && s.limit >= s.ceiling {
            // The limit that drew the last step back held this time: the capacity grew.
            s.ceiling = 0;
            s.spacing_ms = 0;
            s.retest_rounds = 0;
        }
        if s.state == WaveState::Normal {
            return None;
        }
        let mut next = if s.limit < s.threshold { s.limit.saturating_mul(2).min(s.threshold) } else { s.limit + 1 };
        if s.ceiling > 0 && next >= s.ceiling {
            // Test the ceiling again only once its spacing has passed, in time and in rounds.
            next = if now_ms >= s.retest_at_ms && s.rounds >= s.retest_rounds { s.ceiling } else { s.ceiling - 1 };
        }
        let next = next.min(base).max(s.limit);
        if next == s.limit {
            return None;
        }
        s.limit = next;
        if s.limit < base {
            return Some(Transition { from: WaveState::Degraded, to: WaveState::Degraded, limit: s.limit });
        }
        // Back at the base limit; a ceiling there is forgotten only once a round holds.
        s.state = WaveState::Normal;
        s.step = 0;
        Some(Transition { from: WaveState::Degraded, to: WaveState::Normal, limit: s.limit })
    }

    /// Records a 429 for a permit issued in `wave`, with the provider's `Retry-After` if any.
    ///
    /// A [`Cut`](RateLimitEffect::Cut) with a zero cooldown is a step back of
    /// [`Recovery::Adaptive`]: the limit is lower, the wave new, and nothing stops.
    pub fn on_rate_limited(&mut self, wave: u64, now_ms: u64, retry_after: Option<Duration>) -> RateLimitEffect {
        self.poll(now_ms);
        let adaptive = self.config.recovery == Recovery::Adaptive;
        let (retest_after, retest_max) = (duration_ms(self.config.retest_after), duration_ms(self.config.retest_max));
        let rounds_max = self.config.retest_rounds_max.max(1);
        let s = &mut self.snapshot;
        if wave != s.wave {
            return RateLimitEffect::Late { reported: wave, current: s.wave };
        }
        let from = s.limit;
        s.wave += 1;
        s.successes = 0;
        let step_back =
            adaptive && matches!(s.state, WaveState::Normal | WaveState::Degraded) && s.limit > s.good && !s.on_trial;
        if step_back {
            // A test above what held went too far: back to what held (or half, when nothing
            // is known yet), the rejected call alone waits; test again later, and later still
            // after each failed test.
            s.ceiling = s.limit;
            s.limit = if s.good > 0 { s.good } else { (s.limit / 2).max(1) };
            s.threshold = s.limit;
            s.state = WaveState::Degraded;
            let first_failure = s.spacing_ms == 0;
            s.spacing_ms = if first_failure { retest_after } else { s.spacing_ms.saturating_mul(2).min(retest_max) };
            s.retest_at_ms = now_ms.saturating_add(s.spacing_ms);
            s.retest_rounds = if first_failure { 1 } else { s.retest_rounds.saturating_mul(2).min(rounds_max) };
            s.rounds = 0;
            s.on_trial = true;
            return RateLimitEffect::Cut { from, to: s.limit, wave: s.wave, cooldown: Duration::ZERO };
        }
        // The ladder climbs with each stop before NORMAL, unless a limit held since the last
        // one (the provider took a full load again: this stop is a first one).
        let first = s.state == WaveState::Normal || (adaptive && s.good > 0);
        s.step = if first { 0 } else { s.step.saturating_add(1) };
        s.limit = (s.limit / 2).max(1);
        s.threshold = s.limit;
        s.state = WaveState::Cooldown;
        s.ceiling = 0;
        s.good = 0;
        s.spacing_ms = 0;
        s.retest_at_ms = 0;
        s.rounds = 0;
        s.retest_rounds = 0;
        s.on_trial = false;
        let cooldown = self.config.cooldown.duration(s.step, retry_after);
        s.cooldown_until_ms = now_ms.saturating_add(duration_ms(cooldown));
        RateLimitEffect::Cut { from, to: s.limit, wave: s.wave, cooldown }
    }

    /// After the store forgot the upstream's state (an empty restart, `FLUSHALL`, an eviction):
    /// puts back a recovery in progress that a process last saw, `state` at `limit`, so a limit
    /// stepped back by a 429 stays stepped back (the learned ceiling is carried back as a
    /// cooldown is). Only into a machine that looks like a forgotten one — NORMAL at its base
    /// limit in wave 1, no 429 ever seen — and only PROBE or DEGRADED below the base (a cooldown
    /// is carried as a 429). The limit is also the threshold (it grows additively from there).
    /// Returns whether it changed anything. `wave.lua`'s `carry_back` is the Lua twin
    /// (`spec::carry_back_cases`).
    pub fn carry_back(&mut self, state: WaveState, limit: u32) -> bool {
        let base = self.config.base_limit.get();
        let s = &mut self.snapshot;
        let forgotten = s.state == WaveState::Normal && s.wave == 1 && s.limit == base;
        let recovering = matches!(state, WaveState::Probe | WaveState::Degraded);
        if !forgotten || !recovering || limit >= base {
            return false;
        }
        s.state = state;
        s.limit = limit.max(1);
        s.threshold = s.limit;
        s.successes = 0;
        true
    }

    /// Takes a new base limit (a live change of the configured limit): a machine in NORMAL, or
    /// at the old base, follows it; whatever was learned below it (a stepped-back limit, the
    /// threshold, the ceiling a 429 drew, the limit that held) is kept, clamped to it. The
    /// Lua twin is `rebase` in `wave.lua` (every script applies it when the base it is sent
    /// differs from the one stored; table `spec::rebase_cases`).
    pub fn rebase(&mut self, base: NonZeroU32) {
        let old = self.config.base_limit.get();
        self.config.base_limit = base;
        let s = &mut self.snapshot;
        if old != base.get() && (s.state == WaveState::Normal || s.limit == old) {
            s.limit = base.get();
        }
        let snapshot = self.snapshot;
        self.restore(snapshot);
    }

    /// Replaces the state, e.g. with one read back from Redis or carried across an outage.
    /// The limit is clamped to `[1, base]`.
    pub fn restore(&mut self, mut snapshot: WaveSnapshot) {
        let base = self.config.base_limit.get();
        snapshot.limit = snapshot.limit.clamp(1, base);
        snapshot.threshold = snapshot.threshold.clamp(1, base);
        snapshot.ceiling = snapshot.ceiling.min(base);
        snapshot.good = snapshot.good.min(base);
        self.snapshot = snapshot;
    }
}
