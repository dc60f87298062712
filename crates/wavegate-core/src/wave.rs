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
//! The same machine runs in Lua (shared mode, inside Redis) and here (local mode); both are
//! checked against the tables in [`spec`](crate::spec).
//!
//! ```
//! use std::num::NonZeroU32;
//! use std::time::Duration;
//! use wavegate_core::{Admission, WaveConfig, WaveMachine, WaveState};
//!
//! let mut wave = WaveMachine::new(WaveConfig::new(NonZeroU32::new(10).unwrap()));
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
    /// Exactly as the seed walks it: PROBE 1, then DEGRADED doubling 2 → 4 → 8 → … → base,
    /// each after as many successes as the limit. A provider whose real capacity is below the
    /// configured limit is hit again at every cycle.
    Seed,
    /// Slow start with a memory: double up to the halved limit (the slow-start threshold),
    /// then grow by one; count a success towards growth only when the limit is used
    /// (in flight × 2 ≥ limit); remember the limit that drew the last 429 (the ceiling) and
    /// hold one below it for [`CEILING_HOLD`] × limit successes before testing it again. A 429
    /// while growing additively or testing the ceiling steps back by one (and resumes there
    /// after the cooldown, without PROBE) instead of halving. The default: measured against
    /// the seed's recovery in `docs/benchmarks.md` and `cargo run --example simulate`.
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

/// Successes at one below the ceiling (× the limit) before [`Recovery::Adaptive`] tests the
/// ceiling again.
pub const CEILING_HOLD: u32 = 32;

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
}

impl WaveConfig {
    /// Default probe successes (3).
    pub const DEFAULT_PROBE_SUCCESSES: NonZeroU32 = NonZeroU32::new(3).expect("3 is not zero");

    /// The defaults around `base_limit`: 3 probe successes, the default cooldown ladder.
    pub fn new(base_limit: NonZeroU32) -> Self {
        Self {
            base_limit,
            probe_successes: Self::DEFAULT_PROBE_SUCCESSES,
            cooldown: CooldownPolicy::default(),
            recovery: Recovery::default(),
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
    /// [`Recovery::Adaptive`]: the limit that drew the last 429, 0 when none is remembered.
    pub ceiling: u32,
    /// [`Recovery::Adaptive`]: the limit to resume at, in DEGRADED, when the cooldown ends
    /// (0: go through PROBE).
    pub resume: u32,
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
}

impl DenyReason {
    /// A stable lower-case name (`cooldown`, `at_limit`, `requests`, `tokens`,
    /// `tokens_exceed_burst`), as the Lua scripts return it.
    pub const fn as_str(self) -> &'static str {
        match self {
            DenyReason::Cooldown => "cooldown",
            DenyReason::AtLimit => "at_limit",
            DenyReason::RequestBudget => "requests",
            DenyReason::TokenBudget => "tokens",
            DenyReason::TokensExceedBurst => "tokens_exceed_burst",
        }
    }

    /// Parses a name written by [`as_str`](Self::as_str).
    pub fn parse(name: &str) -> Option<Self> {
        [Self::Cooldown, Self::AtLimit, Self::RequestBudget, Self::TokenBudget, Self::TokensExceedBurst]
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
        Self {
            config,
            snapshot: WaveSnapshot {
                state: WaveState::Normal,
                limit: base,
                wave: 1,
                cooldown_until_ms: 0,
                successes: 0,
                step: 0,
                threshold: base,
                ceiling: 0,
                resume: 0,
            },
        }
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
            if s.resume > 0 {
                // A known-good limit: no need to probe from 1.
                s.state = WaveState::Degraded;
                s.limit = s.resume;
                s.resume = 0;
            } else {
                s.state = WaveState::Probe;
                s.limit = 1;
            }
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

    /// Records a successful call of a permit issued in `wave`, with `in_flight` permits held
    /// at the report (the reporting one included; only [`Recovery::Adaptive`] uses it).
    pub fn on_success(&mut self, wave: u64, in_flight: u32) -> Option<Transition> {
        if self.config.recovery == Recovery::Adaptive && self.snapshot.state == WaveState::Degraded {
            return self.adaptive_success(wave, in_flight);
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

    /// [`Recovery::Adaptive`] in DEGRADED: slow start, growth only when used, the ceiling.
    fn adaptive_success(&mut self, wave: u64, in_flight: u32) -> Option<Transition> {
        let base = self.config.base_limit.get();
        let s = &mut self.snapshot;
        if wave != s.wave || in_flight.saturating_mul(2) < s.limit {
            return None;
        }
        s.successes += 1;
        let holding = s.ceiling > 0 && s.limit.saturating_add(1) == s.ceiling;
        let needed = if holding { s.limit.saturating_mul(CEILING_HOLD) } else { s.limit };
        if s.successes < needed {
            return None;
        }
        s.successes = 0;
        if s.ceiling > 0 && s.limit >= s.ceiling {
            // The remembered ceiling held: forget it.
            s.ceiling = 0;
        }
        let mut next = if s.limit < s.threshold { s.limit.saturating_mul(2).min(s.threshold) } else { s.limit + 1 };
        if s.ceiling > 0 && !holding {
            next = next.min(s.ceiling - 1);
        }
        s.limit = next.min(base).max(s.limit);
        if s.limit < base {
            return Some(Transition { from: WaveState::Degraded, to: WaveState::Degraded, limit: s.limit });
        }
        s.state = WaveState::Normal;
        s.step = 0;
        s.ceiling = 0;
        Some(Transition { from: WaveState::Degraded, to: WaveState::Normal, limit: s.limit })
    }

    /// Records a 429 for a permit issued in `wave`, with the provider's `Retry-After` if any.
    pub fn on_rate_limited(&mut self, wave: u64, now_ms: u64, retry_after: Option<Duration>) -> RateLimitEffect {
        self.poll(now_ms);
        let adaptive = self.config.recovery == Recovery::Adaptive;
        let s = &mut self.snapshot;
        if wave != s.wave {
            return RateLimitEffect::Late { reported: wave, current: s.wave };
        }
        let from = s.limit;
        if adaptive && s.state == WaveState::Degraded && s.limit > s.threshold {
            // Growing additively (or testing the ceiling) and hit: the ceiling is here. Step
            // back by one and resume there after the cooldown.
            s.ceiling = s.limit;
            s.limit = (s.limit - 1).max(1);
            s.resume = s.limit;
            s.step = 0;
        } else {
            s.step = if s.state == WaveState::Normal { 0 } else { s.step.saturating_add(1) };
            if adaptive {
                s.ceiling = s.limit;
            }
            s.limit = (s.limit / 2).max(1);
            s.threshold = s.limit;
            s.resume = 0;
        }
        s.wave += 1;
        s.state = WaveState::Cooldown;
        s.successes = 0;
        let cooldown = self.config.cooldown.duration(s.step, retry_after);
        s.cooldown_until_ms = now_ms.saturating_add(duration_ms(cooldown));
        RateLimitEffect::Cut { from, to: s.limit, wave: s.wave, cooldown }
    }

    /// Replaces the state, e.g. with one read back from Redis or carried across an outage.
    /// The limit is clamped to `[1, base]`.
    pub fn restore(&mut self, mut snapshot: WaveSnapshot) {
        let base = self.config.base_limit.get();
        snapshot.limit = snapshot.limit.clamp(1, base);
        snapshot.threshold = snapshot.threshold.clamp(1, base);
        self.snapshot = snapshot;
    }
}
