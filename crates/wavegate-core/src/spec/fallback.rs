//! The fallback's table: the gate [`LocalGate::fallback`] starts with, one rule a case.

use crate::ask::{Ask, Decision};
use crate::config::{UpstreamConfig, UpstreamConfigBuilder};
use crate::gate::{DayLeft, FallbackStart, LastShared, LocalGate, WaveSignal};
use crate::gcra::{Budgets, DayBudget, RateBudget};
use crate::learned_limit::{LearnedBudgets, LearnedLimit, LearnedLimits};
use crate::permit_id::{Instance, PermitId};
use crate::wave::{DenyReason, WaveState};

/// One case of [`LocalGate::fallback`]: the upstream, what the process knew at the switch,
/// what the gate must be.
#[derive(Debug, Clone)]
pub struct FallbackCase {
    /// The rule the case pins down.
    pub name: &'static str,
    /// The upstream's configuration.
    pub config: UpstreamConfig,
    /// What the process knew (held permits by name, with their shared waves).
    pub start: FallbackStart<&'static str>,
    /// When the switch happens (the gate's clock, ms).
    pub now_ms: u64,
    /// What the gate must be.
    pub expect: FallbackExpect,
    /// Then, asks to the gate in this order, each with its answer.
    pub asks: Vec<FallbackAsk>,
}

/// One ask to a fallback's gate after the switch, and its answer. A granted permit is
/// released at once (neutral, nothing settled), so only the budgets carry over to the next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FallbackAsk {
    /// When, in ms after the switch.
    pub after_ms: u64,
    /// Its priority class (`None`: the default, or no classes).
    pub class: Option<&'static str>,
    /// Its tokens estimate.
    pub tokens: u64,
    /// `Ok(())`: granted; otherwise the denial's reason and wait (ms).
    pub expect: Result<(), (DenyReason, u64)>,
}

/// What a [`FallbackCase`] expects of the gate, read at the switch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FallbackExpect {
    /// Its limit: the share.
    pub share: u32,
    /// How many processes the budgets are divided among.
    pub processes: u32,
    /// The state it starts in.
    pub state: WaveState,
    /// The current limit.
    pub limit: u32,
    /// The threshold (the limit a cut left).
    pub threshold: u32,
    /// The rest of a cooldown (0 outside COOLDOWN).
    pub cooldown_left_ms: u64,
    /// The budgets in force: configured and learned, shared.
    pub budgets: Budgets,
    /// Requests and tokens available now, when there are such budgets.
    pub available: (Option<u64>, Option<u64>),
    /// Per class, the largest estimate its asks can reserve: the fleet's (above the share's
    /// own burst, in debt; rule 7).
    pub class_bursts: Vec<Option<u64>>,
    /// The held permits with their waves in the gate's numbering, by name.
    pub held: Vec<(&'static str, u64)>,
}

impl FallbackCase {
    /// Runs [`LocalGate::fallback`] on the case: the differences from the expectation, if any.
    pub fn check(&self) -> Result<(), String> {
        let fallback = LocalGate::fallback(&self.config, self.start.clone(), self.now_ms);
        let mut gate = fallback.gate;
        let now = self.now_ms;
        let (s, in_flight) = gate.status(now);
        let available = gate.budget_status(now);
        let mut held = fallback.held;
        held.sort();
        let got = FallbackExpect {
            share: fallback.share.get(),
            processes: fallback.processes,
            state: s.state,
            limit: s.limit,
            threshold: s.threshold,
            cooldown_left_ms: if s.state == WaveState::Cooldown { s.cooldown_until_ms.saturating_sub(now) } else { 0 },
            budgets: gate.budgets(now),
            available: (available.requests.map(|r| r.0), available.tokens.map(|t| t.0)),
            class_bursts: (0..gate.classes().len()).map(|c| gate.tokens_burst_for(c, now)).collect(),
            held,
        };
        let mut expect = self.expect.clone();
        expect.held.sort();
        if got != expect {
            return Err(format!("case `{}`:\nexpected {expect:?}\n     got {got:?}", self.name));
        }
        if in_flight != self.start.held.len() {
            return Err(format!(
                "case `{}`: {in_flight} permits in flight, not the {} held",
                self.name,
                self.start.held.len()
            ));
        }
        let instance = Instance::new("spec").expect("a valid instance");
        for (n, ask) in self.asks.iter().enumerate() {
            let id = PermitId::new(ask.class, &instance, n as u64 + 1, None);
            let at = now + ask.after_ms;
            let asked = [Ask { id: id.clone(), tokens: ask.tokens, output: 0, waiting: 1 }];
            let got = match gate.acquire(&instance, &asked, 60_000, at) {
                Decision::Granted { wave, .. } => {
                    gate.finish(&id, wave, WaveSignal::Neutral, 0, at);
                    Ok(())
                }
                Decision::Denied { reason, retry_after_ms, .. } => Err((reason, retry_after_ms)),
            };
            if got != ask.expect {
                return Err(format!("case `{}`, ask {n} ({ask:?}): got {got:?}", self.name));
            }
        }
        Ok(())
    }
}

const NOW: u64 = 1_000_000;

fn upstream(builder: UpstreamConfigBuilder) -> UpstreamConfig {
    builder.build().expect("the table's configurations are valid")
}

fn budget(per_minute: u32, burst: u32) -> Option<RateBudget> {
    RateBudget::new(per_minute, burst)
}

/// A case of limit 10 and `live` processes, nothing else known: NORMAL at the share.
fn case(name: &'static str, live: Option<u32>, share: u32, processes: u32) -> FallbackCase {
    FallbackCase {
        name,
        config: upstream(UpstreamConfig::builder("llm").limit(10)),
        start: FallbackStart { live, ..FallbackStart::default() },
        now_ms: NOW,
        expect: FallbackExpect {
            share,
            processes,
            state: WaveState::Normal,
            limit: share,
            threshold: share,
            cooldown_left_ms: 0,
            budgets: Budgets::default(),
            available: (None, None),
            class_bursts: Vec::new(),
            held: Vec::new(),
        },
        asks: Vec::new(),
    }
}

/// An ask `after_ms` after the switch, of `tokens` in `class`, answered `expect`.
fn ask(after_ms: u64, class: Option<&'static str>, tokens: u64, expect: Result<(), (DenyReason, u64)>) -> FallbackAsk {
    FallbackAsk { after_ms, class, tokens, expect }
}

/// 2 processes and `requests_per_day(4, 4)`: each share 2 a day (one per 12 h), bursts of 2.
fn day_of_4(
    name: &'static str,
    day_left: Option<(DayLeft, (u64, u64))>,
    recent_grants: Vec<(u64, u64, u64)>,
    asks: Vec<FallbackAsk>,
) -> FallbackCase {
    FallbackCase {
        name,
        config: upstream(UpstreamConfig::builder("llm").limit(10).requests_per_day(4, 4)),
        start: FallbackStart {
            live: Some(2),
            day_left: day_left.map(|(left, _)| (left, NOW - 1_000)),
            day_used_since: day_left.map_or((0, 0), |(_, used)| used),
            day_used_from: crate::ChargeStart::default(),
            recent_grants,
            ..FallbackStart::default()
        },
        now_ms: NOW,
        expect: FallbackExpect {
            budgets: Budgets { requests_per_day: DayBudget::new(2, 2), ..Budgets::default() },
            ..case("", Some(2), 5, 2).expect
        },
        asks,
    }
}

/// 20 processes and `tokens_per_minute(200_000, 16_000)`: each share 10,000 a minute (6 ms a
/// token), bursts of 800 (limit 40: 2 each).
fn fleet_of_20(name: &'static str, builder: UpstreamConfigBuilder, asks: Vec<FallbackAsk>) -> FallbackCase {
    let config = upstream(builder.limit(40).tokens_per_minute(200_000, 16_000));
    let classes = config.classes().len();
    let class_bursts = (0..classes)
        .map(|c| Some(if config.classes()[c].budget_percent_value() < 100 { 8_000 } else { 16_000 }))
        .collect();
    FallbackCase {
        config,
        expect: FallbackExpect {
            budgets: Budgets { requests: None, tokens: budget(10_000, 800), ..Budgets::default() },
            available: (None, Some(800)),
            class_bursts,
            ..case("", Some(20), 2, 20).expect
        },
        asks,
        ..case(name, Some(20), 2, 20)
    }
}

/// The table of [`LocalGate::fallback`]'s rules.
pub fn fallback_cases() -> Vec<FallbackCase> {
    let last = |state: Option<(WaveState, u32)>, wave: u64, cooldown_left_ms: Option<u64>| LastShared {
        state,
        wave,
        cooldown_left_ms,
    };
    let mut learned = LearnedBudgets::default();
    // 100 requests a minute announced a second ago: kept three windows.
    learned.report(
        LearnedLimits {
            requests: Some(LearnedLimit { limit: 100, window_ms: 60_000 }),
            tokens: None,
            ..LearnedLimits::default()
        },
        NOW - 1_000,
    );
    let budgets =
        UpstreamConfig::builder("llm").limit(10).requests_per_minute(600, 20).tokens_per_minute(60_000, 10_000);
    vec![
        case("the share of the limit: limit ÷ live processes, rounded down", Some(3), 3, 3),
        case("the share of the limit: at least 1", Some(40), 1, 40),
        case("no heartbeat yet: as many processes as the limit, one permit each", None, 1, 10),
        FallbackCase {
            config: upstream(UpstreamConfig::builder("llm").limit(10).fallback_limit(4)),
            ..case(
                "no heartbeat yet, a configured fallback limit: that limit, the budgets divided by the limit",
                None,
                4,
                10,
            )
        },
        FallbackCase {
            config: upstream(UpstreamConfig::builder("llm").limit(10).fallback_limit(4)),
            ..case("a configured fallback limit holds with live processes known too", Some(2), 4, 2)
        },
        FallbackCase {
            config: upstream(budgets.clone()),
            expect: FallbackExpect {
                budgets: Budgets { requests: budget(150, 5), tokens: budget(15_000, 2_500), ..Budgets::default() },
                available: (Some(5), Some(2_500)),
                ..case("", Some(4), 2, 4).expect
            },
            ..case("the budgets' share: rate and burst each divided by the live processes", Some(4), 2, 4)
        },
        FallbackCase {
            start: FallbackStart { live: Some(4), learned, ..FallbackStart::default() },
            expect: FallbackExpect {
                // 100 a minute learned, a quarter of it: 25 a minute, bursts of 25.
                budgets: Budgets { requests: budget(25, 25), tokens: None, ..Budgets::default() },
                available: (Some(25), None),
                ..case("", Some(4), 2, 4).expect
            },
            ..case("the learned limits' share: divided as the configured budgets are", Some(4), 2, 4)
        },
        FallbackCase {
            config: upstream(budgets.clone()),
            start: FallbackStart {
                live: Some(4),
                recent_grants: vec![(NOW - 100, 1_000, 0), (NOW - 50, 500, 0), (NOW - 10, 0, 0)],
                ..FallbackStart::default()
            },
            expect: FallbackExpect {
                budgets: Budgets { requests: budget(150, 5), tokens: budget(15_000, 2_500), ..Budgets::default() },
                // Charged as they happened: 3 requests (100 ms at 2.5 a second gave none
                // back) and 1,500 tokens (100 ms at 250 a second gave 25 back).
                available: (Some(2), Some(1_025)),
                ..case("", Some(4), 2, 4).expect
            },
            ..case(
                "recent grants are charged to the share as they happened: a switch hands out no fresh burst",
                Some(4),
                2,
                4,
            )
        },
        FallbackCase {
            config: upstream(budgets.clone()),
            start: FallbackStart {
                live: Some(4),
                recent_grants: vec![(NOW - 61_000, 2_500, 0), (NOW - 60_500, 0, 0)],
                ..FallbackStart::default()
            },
            expect: FallbackExpect {
                budgets: Budgets { requests: budget(150, 5), tokens: budget(15_000, 2_500), ..Budgets::default() },
                available: (Some(5), Some(2_500)),
                ..case("", Some(4), 2, 4).expect
            },
            ..case("grants of more than a minute ago have come back", Some(4), 2, 4)
        },
        day_of_4(
            "a day the fleet spent stays spent: the share starts from what the store said is left",
            Some((DayLeft { requests: Some(0), tokens: None }, (0, 0))),
            Vec::new(),
            // Half a day at 2 a day for the share's next request, less the second since it was said.
            vec![ask(0, None, 0, Err((DenyReason::RequestBudget, 43_200_000 - 1_000)))],
        ),
        day_of_4(
            "the day's share is what is left divided, less this process's grants since it was said",
            // 4 left: 2 for the share; 1 granted since (the recent grants are the minute's only).
            Some((DayLeft { requests: Some(4), tokens: None }, (1, 0))),
            vec![(NOW - 2_000, 0, 0), (NOW - 500, 0, 0)],
            vec![ask(0, None, 0, Ok(())), ask(0, None, 0, Err((DenyReason::RequestBudget, 43_200_000 - 1_000)))],
        ),
        day_of_4(
            "a process that never heard the store starts with a full day's share, its recent grants charged",
            None,
            vec![(NOW - 2_000, 0, 0)],
            vec![ask(0, None, 0, Ok(())), ask(0, None, 0, Err((DenyReason::RequestBudget, 43_200_000 - 2_000)))],
        ),
        FallbackCase {
            start: FallbackStart {
                live: Some(2),
                last_shared: last(Some((WaveState::Cooldown, 5)), 3, Some(3_000)),
                ..FallbackStart::default()
            },
            expect: FallbackExpect {
                state: WaveState::Cooldown,
                limit: 2,
                threshold: 2,
                cooldown_left_ms: 3_000,
                ..case("", Some(2), 5, 2).expect
            },
            ..case("a shared cooldown in force goes on, at half the share, for the rest of it", Some(2), 5, 2)
        },
        FallbackCase {
            start: FallbackStart {
                live: Some(10),
                last_shared: last(Some((WaveState::Cooldown, 5)), 3, Some(3_000)),
                ..FallbackStart::default()
            },
            expect: FallbackExpect {
                state: WaveState::Cooldown,
                limit: 1,
                threshold: 1,
                cooldown_left_ms: 3_000,
                ..case("", Some(10), 1, 10).expect
            },
            ..case("a shared cooldown at a share of 1: limit 1", Some(10), 1, 10)
        },
        FallbackCase {
            start: FallbackStart {
                live: Some(2),
                last_shared: last(Some((WaveState::Cooldown, 5)), 3, Some(0)),
                ..FallbackStart::default()
            },
            ..case("a cooldown that has ended is not carried (and its state says nothing more)", Some(2), 5, 2)
        },
        FallbackCase {
            start: FallbackStart {
                live: Some(2),
                last_shared: last(Some((WaveState::Degraded, 4)), 3, None),
                ..FallbackStart::default()
            },
            expect: FallbackExpect {
                state: WaveState::Degraded,
                limit: 2,
                threshold: 5,
                ..case("", Some(2), 5, 2).expect
            },
            ..case("a recovery in progress goes on at the share of its limit (4 of 10, share 5: 2)", Some(2), 5, 2)
        },
        FallbackCase {
            start: FallbackStart {
                live: Some(2),
                last_shared: last(Some((WaveState::Probe, 1)), 3, None),
                ..FallbackStart::default()
            },
            expect: FallbackExpect {
                state: WaveState::Probe,
                limit: 1,
                threshold: 5,
                ..case("", Some(2), 5, 2).expect
            },
            ..case("PROBE goes on at limit 1", Some(2), 5, 2)
        },
        FallbackCase {
            start: FallbackStart {
                live: Some(2),
                last_shared: last(Some((WaveState::Normal, 10)), 3, None),
                ..FallbackStart::default()
            },
            ..case("NORMAL is NORMAL at the share", Some(2), 5, 2)
        },
        FallbackCase {
            start: FallbackStart {
                live: Some(2),
                last_shared: last(Some((WaveState::Normal, 10)), 7, None),
                held: vec![("current", 7), ("older", 6)],
                ..FallbackStart::default()
            },
            expect: FallbackExpect { held: vec![("current", 1), ("older", 0)], ..case("", Some(2), 5, 2).expect },
            ..case(
                "held permits are adopted in NORMAL's wave; one of an older shared wave stays older (its 429 is late)",
                Some(2),
                5,
                2,
            )
        },
        FallbackCase {
            start: FallbackStart {
                live: Some(2),
                last_shared: last(Some((WaveState::Cooldown, 5)), 7, Some(2_000)),
                held: vec![("current", 7), ("older", 6)],
                ..FallbackStart::default()
            },
            expect: FallbackExpect {
                state: WaveState::Cooldown,
                limit: 2,
                threshold: 2,
                cooldown_left_ms: 2_000,
                held: vec![("current", 0), ("older", 0)],
                ..case("", Some(2), 5, 2).expect
            },
            ..case(
                "held permits in a carried cooldown report against the wave before: a 429 of theirs cuts nothing again",
                Some(2),
                5,
                2,
            )
        },
        FallbackCase {
            config: upstream(budgets.clone().class("interactive", 3).class("batch", 1).class_budget("batch", 50)),
            expect: FallbackExpect {
                budgets: Budgets { requests: budget(150, 5), tokens: budget(15_000, 2_500), ..Budgets::default() },
                available: (Some(5), Some(2_500)),
                // The largest estimates: the fleet's burst, and the capped class's share of it
                // (above the process's shares, 2,500 and 1,250, they are taken in debt).
                class_bursts: vec![Some(10_000), Some(5_000)],
                ..case("", Some(4), 2, 4).expect
            },
            ..case("a class's own budget is its share of the process's share", Some(4), 2, 4)
        },
        fleet_of_20(
            "above the share's burst: admitted when the share's bucket is full, in debt, then at the share's rate",
            UpstreamConfig::builder("llm"),
            vec![
                ask(0, None, 4_000, Ok(())),
                // 4,000 tokens at 6 ms: 24 s of debt; everything waits until it is paid.
                ask(1, None, 4_000, Err((DenyReason::TokenBudget, 23_999))),
                ask(1, None, 800, Err((DenyReason::TokenBudget, 23_999))),
                ask(23_999, None, 4_000, Err((DenyReason::TokenBudget, 1))),
                ask(24_000, None, 4_000, Ok(())),
            ],
        ),
        fleet_of_20(
            "above the share's burst: waits until the share's bucket is full, even when a smaller call would fit",
            UpstreamConfig::builder("llm"),
            vec![
                ask(0, None, 100, Ok(())),
                ask(0, None, 4_000, Err((DenyReason::TokenBudget, 600))),
                ask(0, None, 700, Ok(())),
                ask(600, None, 4_000, Err((DenyReason::TokenBudget, 4_200))),
                ask(4_800, None, 4_000, Ok(())),
            ],
        ),
        fleet_of_20(
            "above the fleet's burst: never fits, as in shared mode",
            UpstreamConfig::builder("llm"),
            vec![ask(0, None, 16_001, Err((DenyReason::TokensExceedBurst, 0))), ask(0, None, 16_000, Ok(()))],
        ),
        fleet_of_20(
            "a capped class: in debt above its share of the share, never above its share of the fleet's burst",
            UpstreamConfig::builder("llm").class("interactive", 3).class("batch", 1).class_budget("batch", 50),
            vec![
                ask(0, Some("batch"), 8_001, Err((DenyReason::TokensExceedBurst, 0))),
                ask(0, Some("batch"), 4_000, Ok(())),
                // The upstream's share is in debt for 24 s (a small call waits for 24 s less the 4.8 s
                // of its burst), the class's (5,000 a minute) for 48 s.
                ask(1, Some("interactive"), 100, Err((DenyReason::TokenBudget, 19_799))),
                ask(24_000, Some("interactive"), 4_000, Ok(())),
            ],
        ),
        FallbackCase {
            start: FallbackStart { live: Some(20), learned: learned_tokens(), ..FallbackStart::default() },
            expect: FallbackExpect {
                // 8,000 a minute learned, a twentieth: 400 a minute, bursts of 400.
                budgets: Budgets { requests: None, tokens: budget(400, 400), ..Budgets::default() },
                available: (None, Some(400)),
                ..fleet_of_20("", UpstreamConfig::builder("llm"), Vec::new()).expect
            },
            ..fleet_of_20(
                "a learned limit bounds the largest estimate as in shared mode: the fleet's learned burst",
                UpstreamConfig::builder("llm"),
                vec![ask(0, None, 8_001, Err((DenyReason::TokensExceedBurst, 0))), ask(0, None, 4_000, Ok(()))],
            )
        },
    ]
}

/// 8,000 tokens a minute announced a second before the switch.
fn learned_tokens() -> LearnedBudgets {
    let mut learned = LearnedBudgets::default();
    learned.report(
        LearnedLimits {
            requests: None,
            tokens: Some(LearnedLimit { limit: 8_000, window_ms: 60_000 }),
            ..LearnedLimits::default()
        },
        NOW - 1_000,
    );
    learned
}
