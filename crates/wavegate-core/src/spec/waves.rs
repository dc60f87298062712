//! The wave machine's tables: one upstream, one process, one ask at a time.

use super::{Expect, SpecAsk, SpecCase, SpecSignal, Step, Wakes};
use crate::token_delta::WindowsBack;
use crate::wave::{Recovery, WaveState};

pub(super) const LEASE_MS: u64 = 60_000;

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
    Step::Finish { permit, wave: None, signal, token_delta: 0, held: true, wakes: Wakes::Unchecked }
}

fn split(permit: &'static str, tokens: u64, output: u64) -> Step {
    let expect = Expect::Granted { wave: 1, state: WaveState::Normal, limit: 10 };
    Step::AcquireSplit { permit, tokens, output, expect }
}

fn settle(permit: &'static str, token_delta: i64) -> Step {
    Step::Finish { permit, wave: None, signal: SpecSignal::Success, token_delta, held: true, wakes: Wakes::Unchecked }
}

fn window(requests: Option<(u64, u64)>, tokens: Option<(u64, u64)>, tokens_each: u64) -> Step {
    answer(None, requests, tokens, tokens_each)
}

/// Process `instance` asks for `permit` reserving `tokens`; the answer must be `expect`.
fn from(instance: &'static str, permit: &'static str, tokens: u64, expect: Expect) -> Step {
    let ask = SpecAsk { permit, class: "default", tenant: None, tokens, waiting: 1 };
    Step::AcquireAmong { instance, asks: vec![ask], answers: permit, expect }
}

/// The answer to `permit` (still held): what is left, as [`window`] says it.
fn window_by(permit: &'static str, requests: Option<(u64, u64)>, tokens: Option<(u64, u64)>, tokens_each: u64) -> Step {
    answer(Some(permit), requests, tokens, tokens_each)
}

fn answer(
    by: Option<&'static str>,
    requests: Option<(u64, u64)>,
    tokens: Option<(u64, u64)>,
    tokens_each: u64,
) -> Step {
    Step::ReportWindow {
        by,
        requests,
        tokens,
        tokens_each,
        learned_requests: None,
        learned_tokens: None,
        learned_parts: [None; 2],
        refills_requests: None,
        refills_tokens: None,
        parts: [None; 2],
        refused: None,
    }
}

/// A response with OpenAI's headers: `(remaining, time to full in ms, limit)` of a
/// continuously refilled requests and tokens bucket.
fn refilling(requests: Option<(u64, u64, u64)>, tokens: Option<(u64, u64, u64)>, tokens_each: u64) -> Step {
    refilling_by(None, requests, tokens, tokens_each)
}

/// [`refilling`], the answer to `by` when it names a permit (still held).
fn refilling_by(
    by: Option<&'static str>,
    requests: Option<(u64, u64, u64)>,
    tokens: Option<(u64, u64, u64)>,
    tokens_each: u64,
) -> Step {
    Step::ReportWindow {
        by,
        requests: requests.map(|(left, reset, _)| (left, reset)),
        tokens: tokens.map(|(left, reset, _)| (left, reset)),
        tokens_each,
        learned_requests: None,
        learned_tokens: None,
        learned_parts: [None; 2],
        refills_requests: requests.map(|(.., limit)| limit),
        refills_tokens: tokens.map(|(.., limit)| limit),
        parts: [None; 2],
        refused: None,
    }
}

/// A response announcing Anthropic's input and output limits only: `(limit, window in ms)`.
fn learn_parts(input: Option<(u64, u64)>, output: Option<(u64, u64)>) -> Step {
    Step::ReportWindow {
        by: None,
        requests: None,
        tokens: None,
        tokens_each: 0,
        learned_requests: None,
        learned_tokens: None,
        learned_parts: [input, output],
        refills_requests: None,
        refills_tokens: None,
        parts: [None; 2],
        refused: None,
    }
}

/// A response announcing limits only: `(limit, window in ms)` for requests and tokens.
fn learn(learned_requests: Option<(u64, u64)>, learned_tokens: Option<(u64, u64)>) -> Step {
    Step::ReportWindow {
        by: None,
        requests: None,
        tokens: None,
        tokens_each: 0,
        learned_requests,
        learned_tokens,
        learned_parts: [None; 2],
        refills_requests: None,
        refills_tokens: None,
        parts: [None; 2],
        refused: None,
    }
}

/// The answer to `by` (still held) with Anthropic's input and output windows only, each
/// `(remaining, time to full in ms, limit)`.
fn parts_by(by: Option<&'static str>, input: (u64, u64, u64), output: (u64, u64, u64)) -> Step {
    parts_report(by, input, output, None)
}

fn parts_report(
    by: Option<&'static str>,
    input: (u64, u64, u64),
    output: (u64, u64, u64),
    refused: Option<(u64, u64)>,
) -> Step {
    Step::ReportWindow {
        by,
        requests: None,
        tokens: None,
        tokens_each: 0,
        learned_requests: None,
        learned_tokens: None,
        learned_parts: [None; 2],
        refills_requests: None,
        refills_tokens: None,
        parts: [Some(input), Some(output)],
        refused,
    }
}

/// [`parts_by`] for an answer that refused `by`'s call, which had reserved `(tokens, output)`.
fn refused_parts_by(by: &'static str, reserved: (u64, u64), input: (u64, u64, u64), output: (u64, u64, u64)) -> Step {
    parts_report(Some(by), input, output, Some(reserved))
}

/// [`denied_window`] for an ask of `(tokens, output)`.
fn denied_split_window(permit: &'static str, (tokens, output): (u64, u64), max_ms: u64) -> Step {
    Step::AcquireSplit { permit, tokens, output, expect: Expect::DeniedProviderWindow { max_ms } }
}

fn denied_window(permit: &'static str, tokens: u64, max_ms: u64) -> Step {
    Step::Acquire { permit, tokens, expect: Expect::DeniedProviderWindow { max_ms } }
}

pub(super) fn status(state: WaveState, limit: u32, wave: u64, in_flight: usize) -> Step {
    Step::Status { state, limit, wave, in_flight }
}

const PERMITS: [&str; 16] =
    ["p0", "p1", "p2", "p3", "p4", "p5", "p6", "p7", "p8", "p9", "p10", "p11", "p12", "p13", "p14", "p15"];

/// `count` permits granted together in `state`, then all finished with success. At the limit
/// one more ask is refused, and the first release hands it the freed permit ([`handing_over`]).
fn round(count: usize, wave: u64, state: WaveState, limit: u32) -> Vec<Step> {
    let mut steps: Vec<Step> = PERMITS[..count].iter().map(|p| granted(p, wave, state, limit)).collect();
    let finishes = PERMITS[..count].iter().map(|p| finish(p, SpecSignal::Success)).collect();
    if count == limit as usize {
        steps.push(denied_at_limit("over"));
        steps.extend(handing_over(finishes));
    } else {
        steps.extend(finishes);
    }
    steps
}

/// `steps` after an ask `over` was refused at the limit: their first release hands `over` the
/// freed permit, and `over`'s caller, gone meanwhile, gives it back unused at once.
fn handing_over(mut steps: Vec<Step>) -> Vec<Step> {
    let first = steps.iter().position(|step| matches!(step, Step::Finish { .. })).expect("a release");
    if let Step::Finish { wakes, .. } = &mut steps[first] {
        *wakes = Wakes::Hands(super::SPEC_INSTANCE, "over");
    }
    let back = Step::Finish {
        permit: "over",
        wave: None,
        signal: SpecSignal::Neutral,
        token_delta: 0,
        held: true,
        wakes: Wakes::Nobody,
    };
    steps.insert(first + 1, back);
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

pub(super) fn case(name: &'static str, steps: Vec<Step>) -> SpecCase {
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
        input_per_minute: None,
        output_per_minute: None,
        requests_per_day: None,
        tokens_per_day: None,
        recovery: Recovery::Seed,
        retest_ms: (200, 800),
        classes: Vec::new(),
        default_class: 0,
        class_window_ms: 0,
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

/// The passes of calls in shadow of other processes (never held).
const SERVED: [&str; 4] = ["s0", "s1", "s2", "s3"];
const REFUSED: [&str; 4] = ["r0", "r1", "r2", "r3"];

/// The call of `pass` was served from `went_ago` to `ended_ago` ms ago, recorded as it ended.
fn recorded(pass: &'static str, went_ago: u64, ended_ago: u64) -> Step {
    recorded_as(pass, went_ago, ended_ago, true)
}

/// The same, `served` or not (refused).
fn recorded_as(pass: &'static str, went_ago: u64, ended_ago: u64, served: bool) -> Step {
    let signal = SpecSignal::Recorded(went_ago, ended_ago, served);
    Step::Finish { permit: pass, wave: None, signal, token_delta: 0, held: false, wakes: Wakes::Nobody }
}

/// Adaptive at base 8: eight permits, the first meets a 429 — 8 is too many: half (nothing
/// held yet), threshold 4, ceiling 8, re-test in 200 ms — the others end, four are granted in
/// wave 2, and `over` is refused at the limit.
fn stepped_back_from_eight() -> Vec<Step> {
    use WaveState::{Degraded, Normal};
    let mut steps: Vec<Step> = PERMITS[..8].iter().map(|p| granted(p, 1, Normal, 8)).collect();
    steps.push(finish("p0", SpecSignal::RateLimited(None)));
    steps.push(status(Degraded, 4, 2, 7));
    steps.extend(PERMITS[1..8].iter().map(|p| finish(p, SpecSignal::Neutral)));
    steps.extend(PERMITS[..4].iter().map(|p| granted(p, 2, Degraded, 4)));
    steps.push(denied_at_limit("over"));
    steps
}

/// The cases of one process asking for one permit at a time.
pub(super) fn cases() -> Vec<SpecCase> {
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
                Step::Finish {
                    permit: "P",
                    wave: Some(1),
                    signal: RateLimited(None),
                    token_delta: 0,
                    held: true,
                    wakes: Wakes::Unchecked,
                },
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
                Step::Finish {
                    permit: "ghost",
                    wave: Some(1),
                    signal: Neutral,
                    token_delta: 0,
                    held: false,
                    wakes: Wakes::Unchecked,
                },
                finish("A", Neutral),
                Step::Finish {
                    permit: "A",
                    wave: None,
                    signal: Neutral,
                    token_delta: 0,
                    held: false,
                    wakes: Wakes::Unchecked,
                },
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
                    Step::Finish {
                        permit: "A",
                        wave: None,
                        signal: RateLimited(None),
                        token_delta: 0,
                        held: false,
                        wakes: Wakes::Unchecked,
                    },
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
            requests_per_minute: Some((600, 4)),
            ..case(
                "a live burst: a cut keeps what was spent (in debt below it), a raise gives the difference at once",
                vec![
                    with_tokens("A", 0),
                    with_tokens("B", 0),
                    with_tokens("C", 0),
                    with_tokens("D", 0),
                    denied("E", 0, Expect::DeniedRequests),
                    // 4 spent, burst 2: 2 in debt, paid back at one per 100 ms before E fits.
                    Step::SetBudgets { requests: Some((600, 2)), tokens: None },
                    denied("E", 0, Expect::DeniedRequests),
                    Step::Advance { ms: 150 },
                    denied("E", 0, Expect::DeniedRequests),
                    Step::Advance { ms: 200 },
                    with_tokens("E", 0),
                    // Empty at burst 2 (150 ms ahead); burst 5: 3 more at once, not 5.
                    Step::SetBudgets { requests: Some((600, 5)), tokens: None },
                    with_tokens("F", 0),
                    with_tokens("G", 0),
                    with_tokens("H", 0),
                    denied("I", 0, Expect::DeniedRequests),
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
            // 1 input token a ms (burst 10,000), 1 output token per 10 ms (burst 2,000).
            input_per_minute: Some((60_000, 10_000)),
            output_per_minute: Some((6_000, 2_000)),
            ..case(
                "input and output: each part reserved from its own budget, settled apart; either can refuse",
                vec![
                    // 10,000 in and 2,000 out: both bursts, each whole (one tokens budget of
                    // 12,000 would have had to hold both).
                    split("A", 12_000, 2_000),
                    // Output spent: 100 more wait for 1 s; input alone would have fitted.
                    Step::AcquireSplit { permit: "B", tokens: 100, output: 100, expect: Expect::DeniedTokens },
                    // A used 10,200 in and 300 out: 1,700 output back, 200 input more.
                    Step::FinishSplit { permit: "A", token_delta: -1_500, output_delta: -1_700 },
                    // The output has room; the input is 200 in debt: even 0 of it waits 200 ms.
                    Step::AcquireSplit { permit: "B", tokens: 100, output: 100, expect: Expect::DeniedTokens },
                    Step::Advance { ms: 190 },
                    Step::AcquireSplit { permit: "B", tokens: 100, output: 100, expect: Expect::DeniedTokens },
                    Step::Advance { ms: 10 },
                    split("B", 100, 100),
                    // An output part above the output burst never fits, whatever the input.
                    Step::AcquireSplit { permit: "C", tokens: 2_500, output: 2_001, expect: Expect::DeniedTooLarge },
                    // An input part above the input burst neither.
                    Step::AcquireSplit { permit: "C", tokens: 10_001, output: 0, expect: Expect::DeniedTooLarge },
                ],
            )
        },
        case(
            "learned apart: Anthropic's input and output limits tighten the input and output budgets",
            vec![
                // ITPM 60,000 and OTPM 6,000 announced, nothing configured.
                learn_parts(Some((60_000, 60_000)), Some((6_000, 60_000))),
                // 10,000 in and 2,000 out: a call Anthropic serves, each part within its limit.
                split("A", 12_000, 2_000),
                // 4,500 more out: above what is left of the output (4,000), though far within
                // the sum of both limits.
                Step::AcquireSplit { permit: "B", tokens: 4_500, output: 4_500, expect: Expect::DeniedTokens },
                // 40,000 more in and none out: the input has room.
                split("B", 40_000, 0),
                // An output part above the output limit never fits.
                Step::AcquireSplit { permit: "C", tokens: 6_001, output: 6_001, expect: Expect::DeniedTooLarge },
            ],
        ),
        SpecCase {
            // 43,200 requests a day (one per 2 s), 4 at once; 864,000 tokens a day (10 a
            // second), 600 at once; and 600 tokens a minute (10 a second too, burst 1,000)
            // besides, never the tighter here. (The Lua twin sleeps through `Advance`: the day
            // budgets' hours are in the core's own tests.)
            requests_per_day: Some((43_200, 4)),
            tokens_per_day: Some((864_000, 600)),
            tokens_per_minute: Some((600, 1_000)),
            ..case(
                "a day: requests and tokens per day beside the minute's; settled like the minute",
                vec![
                    with_tokens("A", 500),
                    // A used 200 of its 500: 300 back to the day (and the minute).
                    settle("A", -300),
                    // 400 left of the day: 450 waits for 50 more, 5 s.
                    denied("B", 450, Expect::DeniedTokensFor(5_000)),
                    // Above the day's burst: never fits.
                    denied("B", 601, Expect::DeniedTooLarge),
                    with_tokens("B", 100),
                    with_tokens("C", 0),
                    with_tokens("D", 0),
                    // The fifth request at once waits 2 s for the day's next.
                    denied("E", 0, Expect::DeniedRequestsFor(2_000)),
                    Step::Advance { ms: 2_000 },
                    with_tokens("E", 0),
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
                let mut steps = stepped_back_from_eight();
                // Fully used rounds: 4, 5 and 6 hold; growth by one from the threshold.
                steps.extend(handing_over(busy_round(4, 2, Degraded, 5)));
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
                steps.extend(handing_over(
                    PERMITS[..7].iter().flat_map(|p| [finish(p, Neutral), granted(p, 3, Degraded, 7)]).collect(),
                ));
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
            base_limit: 8,
            recovery: Recovery::Adaptive,
            ..case("adaptive: successes the provider served below the limit grow it but never make it one that held", {
                let mut steps = stepped_back_from_eight();
                // Four permits held, but the provider served 3 at once (shadow: the permits are
                // ghosts'): the limit was used, so it grows, but 4 did not hold.
                let served = busy_round(4, 2, Degraded, 5).into_iter().map(|step| match step {
                    Step::Finish { permit, wave, token_delta, held, wakes, .. } => {
                        Step::Finish { permit, wave, signal: SpecSignal::Served(3), token_delta, held, wakes }
                    }
                    step => step,
                });
                steps.extend(handing_over(served.collect()));
                steps.push(granted("p4", 2, Degraded, 5));
                // A 429 at 5 steps back by half (nothing held), not to 4 as after full rounds.
                steps.push(finish("p4", RateLimited(None)));
                steps.push(status(Degraded, 2, 3, 4));
                steps
            })
        },
        SpecCase {
            base_limit: 8,
            recovery: Recovery::Adaptive,
            ..case("adaptive: a served success counts the fleet's served calls recorded beside it", {
                let mut steps = stepped_back_from_eight();
                // Four calls of other processes, each of which saw only its own call served (1),
                // were served for 100 ms side by side, recorded as each ended.
                steps.extend(SERVED.iter().map(|pass| recorded(pass, 100, 0)));
                // Each success counts the four: the limit of 4 held, fully used; it grows.
                steps.extend(handing_over(
                    PERMITS[..4]
                        .iter()
                        .enumerate()
                        .flat_map(|(i, p)| {
                            let limit = if i == 3 { 5 } else { 4 };
                            [finish(p, SpecSignal::ServedSpan(1, 100, 0)), granted(p, 2, Degraded, limit)]
                        })
                        .collect(),
                ));
                steps.push(granted("p4", 2, Degraded, 5));
                // So a 429 at 5 steps back to 4, what held (with 1 counted, nothing would have).
                steps.push(finish("p4", RateLimited(None)));
                steps.push(status(Degraded, 4, 3, 4));
                steps
            })
        },
        SpecCase {
            base_limit: 8,
            recovery: Recovery::Adaptive,
            ..case(
                "adaptive: a 429 among the fleet's served calls is the limit's only when they leave it within the limit",
                {
                    let mut steps = stepped_back_from_eight();
                    steps.extend(SERVED.iter().map(|pass| recorded(pass, 100, 0)));
                    // A call refused 50 ms ago met those four: five at once, more than the limit of
                    // 4: enforcing would not have sent it; nothing to learn.
                    steps.extend(handing_over(vec![
                        finish("p0", SpecSignal::RateLimitedAmong(50, 50)),
                        status(Degraded, 4, 2, 3),
                        granted("p0", 2, Degraded, 4),
                    ]));
                    // Later, one refused beside four others being refused (a provider counts
                    // the calls it refuses too; the record keeps none as served): five.
                    steps.push(Step::Advance { ms: 200 });
                    steps.extend(REFUSED.iter().map(|pass| recorded_as(pass, 30, 5, false)));
                    steps.push(finish("p1", SpecSignal::RateLimitedAmong(10, 10)));
                    steps.push(status(Degraded, 4, 2, 3));
                    steps.push(granted("p1", 2, Degraded, 4));
                    // One refused alone, later still: the limit's (on trial since the step
                    // back: a stop).
                    steps.push(Step::Advance { ms: 200 });
                    steps.push(finish("p2", SpecSignal::RateLimitedAmong(10, 10)));
                    steps.push(status(Cooldown, 2, 3, 3));
                    steps
                },
            )
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
            "provider window: an earlier end is the provider's newer word and shortens the window",
            vec![
                window(Some((0, 5_000)), None, 0),
                denied_window("A", 0, 5_000),
                window(Some((3, 300)), None, 0),
                granted("A", 1, Normal, 10),
            ],
        ),
        case(
            "provider window: an absurd reset pauses a day at most, and what is left stays a number",
            vec![
                window(Some((u64::MAX, u64::MAX)), None, 0),
                granted("A", 1, Normal, 10),
                window(Some((0, u64::MAX)), None, 0),
                denied_window("B", 0, crate::MAX_WINDOW_MS),
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
        case(
            "provider window: an answer leaves out only what was granted after its own call",
            vec![
                // The first answer starts the count of grants (a spent window, over soon).
                window(None, Some((0, 100)), 0),
                Step::Advance { ms: 150 },
                with_tokens("Z", 50),
                with_tokens("A", 100),
                with_tokens("B", 200),
                with_tokens("C", 300),
                // A's answer says 1,000 left: Z, admitted before A, is in it; B and C, granted
                // after A, are not yet (500 tokens), so 500 are left, not 1,000 - 3 x 100.
                window_by("A", None, Some((1_000, 5_000)), 100),
                with_tokens("D", 500),
                denied_window("E", 1, 5_000),
            ],
        ),
        case(
            "provider window: OpenAI's bucket has grown back since the answering call's grant",
            vec![
                // The first answer starts the count of grants (a spent window, over soon).
                window(None, Some((0, 100)), 0),
                Step::Advance { ms: 150 },
                with_tokens("A", 100),
                Step::Advance { ms: 500 },
                // A's answer: 0 of 1,000 left at A's admission, full in 1 s: half is back now.
                refilling_by(Some("A"), None, Some((0, 1_000, 1_000)), 100),
                with_tokens("B", 500),
                denied_window("C", 10, 20),
            ],
        ),
        case(
            "provider window: an answer to a permit granted before the first report counts every call in flight",
            vec![
                with_tokens("A", 100),
                with_tokens("B", 200),
                // No count was kept when A was granted: B is assumed to cost as much as A.
                window_by("A", None, Some((1_000, 5_000)), 100),
                with_tokens("C", 900),
                denied_window("D", 1, 5_000),
            ],
        ),
        case(
            "provider window: an answer with a mark raises a bucket a rough count held low",
            vec![
                // Four calls before any report: no marks. A's answer counts the three others at
                // A's whole reservation: 2,000 left less 3,000 is nothing, full in 10 s.
                with_tokens("A", 1_000),
                with_tokens("B", 1_000),
                with_tokens("C", 1_000),
                with_tokens("D", 1_000),
                refilling_by(Some("A"), None, Some((2_000, 8_000, 10_000)), 1_000),
                Step::Advance { ms: 100 },
                with_tokens("E", 100),
                // E's answer (it has a mark): 1,900 left as of E's grant. It is exact, and
                // replaces the rough count's bucket, which had 0 left.
                refilling_by(Some("E"), None, Some((1_900, 7_600, 10_000)), 100),
                with_tokens("F", 1_500),
                denied_window("G", 1_000, 2_000),
            ],
        ),
        case(
            "provider window: Anthropic's input and output are tracked apart; the output takes back what is given back",
            vec![
                // 40,000 of 50,000 input left, full in 12 s; 400 of 8,000 output, full in 57 s.
                parts_by(None, (40_000, 12_000, 50_000), (400, 57_000, 8_000)),
                // A small prompt whose output the bucket holds; then none is left for another.
                split("A", 1_400, 400),
                denied_split_window("B", (600, 100), 800),
                Step::Advance { ms: 1_000 },
                split("C", 600, 100),
                // A ends having used 100 of its 400: Anthropic gives the 300 back.
                Step::FinishSplit { permit: "A", token_delta: -300, output_delta: -300 },
                // C's answer, counted at its admission (before A's end): 33 output left. The
                // 300 given back since C's grant are back: D's 300 fit, E's 100 more do not.
                parts_by(Some("C"), (38_000, 14_000, 50_000), (33, 59_800, 8_000)),
                split("D", 700, 300),
                denied_split_window("E", (600, 100), 800),
            ],
        ),
        case(
            "provider window: a call the provider refused gives its whole reservation back to every window",
            vec![
                // 10,000 input and 2,000 output tokens left of fixed windows ending in 60 s.
                parts_by(None, (10_000, 60_000, 0), (2_000, 60_000, 0)),
                split("B", 1_100, 100),
                split("A", 4_400, 400),
                // B's answer is a 429 without headers: the provider counted none of it, so its
                // 1,000 input and 100 output tokens are back (6,000 and 1,600 left): E fits.
                Step::Refused { permit: "B", tokens: 1_100, output: 100, windows: WindowsBack::Reservation },
                split("E", 6_100, 100),
                // A's answer is a 429 saying 8,000 input and 1,800 output tokens are left (others
                // spent 2,000 and 200; neither A nor B is counted, nor E, granted after A): A's
                // reservation comes back before the answer is taken in (4,000 and 1,900), which
                // then leaves 2,000 and 1,700; its settlement gives nothing back again.
                refused_parts_by("A", (4_400, 400), (8_000, 60_000, 0), (1_800, 60_000, 0)),
                Step::Refused { permit: "A", tokens: 4_400, output: 400, windows: WindowsBack::Nothing },
                split("C", 2_100, 100),
                denied_split_window("D", (2, 1), 60_000),
            ],
        ),
        case(
            "provider window: a refused call an answer neither counted nor took off is not given back",
            vec![
                // 10,000 input and 2,000 output tokens left of fixed windows ending in 60 s.
                parts_by(None, (10_000, 60_000, 0), (2_000, 60_000, 0)),
                split("X", 4_400, 400),
                split("Y", 1_100, 100),
                // Y's answer (others spent 6,000 and 400; X, refused at its admission, is not
                // counted): 3,000 input and 1,500 output left, with nothing granted since Y. The
                // input window takes it in (it knew 5,000); the output window knew 1,500
                // already, X's 400 among them, and keeps its word.
                parts_by(Some("Y"), (3_000, 60_000, 0), (1_500, 60_000, 0)),
                // X's 429 comes: Y's answer never counted X, so nothing comes back to either
                // window (given back, X's 400 output tokens would lift the output window to
                // 1,900, 400 above what Y's answer said).
                Step::Refused { permit: "X", tokens: 4_400, output: 400, windows: WindowsBack::Reservation },
                split("Z", 1_600, 1_500),
                denied_split_window("D", (2, 1), 60_000),
            ],
        ),
        case(
            "provider window: a refused call granted before the first report gives back no more than the answer took off for it",
            vec![
                // Two calls before any report: no marks. A reserved 100, B 5,000.
                with_tokens("A", 100),
                with_tokens("B", 5_000),
                // A's answer: 1,000 tokens left of a fixed window (A counted; B, refused
                // below, never is). B is taken off at A's reservation: 900 left.
                window_by("A", None, Some((1_000, 60_000)), 100),
                // B's 429 without headers: it gives back the 100 taken off for it, not its
                // whole 5,000 (5,900 left where the provider has 1,000).
                Step::Refused { permit: "B", tokens: 5_000, output: 0, windows: WindowsBack::Reservation },
                // The provider has 1,000 left: 1,001 must wait for the window's end.
                denied_window("C", 1_001, 60_000),
            ],
        ),
        case(
            "provider window: a refused call gives back no more than the answer could take off (an estimate floored at 0)",
            vec![
                // A first answer starts the count of grants; its window resets now (none runs).
                window(None, Some((5_000, 0)), 0),
                // X (100) and B (5,000) are granted with marks; no window runs to count them.
                with_tokens("X", 100),
                with_tokens("B", 5_000),
                // X's answer: 1,000 left at X's admission. B, granted since, is taken off:
                // 1,000 - 5,000 is floored at 0 (4,000 of B's reservation taken off nothing).
                window_by("X", None, Some((1_000, 60_000)), 100),
                // B's 429: the provider never counted it: the 4,000 taken off beyond what was
                // left come back first, then 1,000 (all 5,000 would leave 5,000 where the provider has 1,000).
                Step::Refused { permit: "B", tokens: 5_000, output: 0, windows: WindowsBack::Reservation },
                denied_window("C", 1_001, 60_000),
            ],
        ),
        case(
            "provider window: a 429 without headers does not open a Retry-After pause another 429 started",
            vec![
                // A first answer starts the count of grants (its window resets now).
                window(Some((100, 0)), None, 0),
                with_tokens("A", 0),
                with_tokens("B", 0),
                // A's 429 with a Retry-After of 30 s (a spent requests window); B, granted
                // since A, is taken off 0: still 0.
                Step::ReportWindow {
                    by: Some("A"),
                    requests: Some((0, 30_000)),
                    tokens: None,
                    tokens_each: 0,
                    learned_requests: None,
                    learned_tokens: None,
                    learned_parts: [None; 2],
                    refills_requests: None,
                    refills_tokens: None,
                    parts: [None; 2],
                    refused: Some((0, 0)),
                },
                Step::Refused { permit: "A", tokens: 0, output: 0, windows: WindowsBack::Nothing },
                // B's 429 comes without headers: its request pays what was taken off beyond the
                // pause's 0, and the pause stays.
                Step::Refused { permit: "B", tokens: 0, output: 0, windows: WindowsBack::Reservation },
                // The provider asked for 30 s of silence: nothing may go before.
                denied_window("C", 0, 30_000),
            ],
        ),
        case(
            "budget turn: waiters of every process are served in the order the budgets refused them",
            vec![
                // 0 of 1,000 tokens left, full in 1 s: a token a millisecond.
                refilling(None, Some((0, 1_000, 1_000)), 0),
                // a needs 500: refused for 500 ms, it takes the turn.
                from("a", "A", 500, Expect::DeniedProviderWindow { max_ms: 500 }),
                Step::Advance { ms: 200 },
                // b's 100 fit now, but the room is a's until it is served: b joins the line.
                from("b", "B", 100, Expect::DeniedEarlierWaiter { max_ms: 310 }),
                Step::Advance { ms: 310 },
                from("a", "A", 500, Expect::Granted { wave: 1, state: WaveState::Normal, limit: 10 }),
                // a passed the turn to b, first in line: d, asking first, waits behind it.
                from("d", "D", 5, Expect::DeniedEarlierWaiter { max_ms: 10 }),
                // b is refused by the bucket (10 left) and keeps the turn: c's 5 would fit.
                from("b", "B", 100, Expect::DeniedProviderWindow { max_ms: 100 }),
                from("c", "C", 5, Expect::DeniedEarlierWaiter { max_ms: 100 }),
                // b never comes back: 250 ms past its time the turn passes to d, then to c.
                Step::Advance { ms: 400 },
                from("c", "C", 5, Expect::DeniedEarlierWaiter { max_ms: 10 }),
                Step::Advance { ms: 260 },
                from("c", "C", 5, Expect::Granted { wave: 1, state: WaveState::Normal, limit: 10 }),
            ],
        ),
        SpecCase {
            base_limit: 2,
            tokens_per_minute: Some((60_000, 1_000)),
            ..case(
                "budget turn: only a budget takes it (not a too-large ask, not the limit); a stale holder passes it on",
                {
                    let ok = Expect::Granted { wave: 1, state: WaveState::Normal, limit: 2 };
                    vec![
                        // A token a millisecond, burst 1,000: a takes it all.
                        from("a", "A1", 1_000, ok),
                        // Above the burst: refused first, and no turn taken.
                        from("b", "B1", 2_000, Expect::DeniedTooLarge),
                        Step::Advance { ms: 100 },
                        from("c", "C1", 50, ok),
                        // At the limit: refused before the budgets, no turn either.
                        from("b", "B2", 500, Expect::DeniedAtLimit),
                        finish("A1", SpecSignal::Success),
                        // 50 left, 500 asked: b takes the turn for 450 ms.
                        from("b", "B2", 500, Expect::DeniedTokens),
                        finish("C1", SpecSignal::Success),
                        Step::Advance { ms: 460 },
                        // b's time came and went: its room, with 10 ms between asks.
                        from("c", "C2", 5, Expect::DeniedEarlierWaiter { max_ms: 10 }),
                        // 250 ms past its time b has given it up: c, first in line, holds it.
                        Step::Advance { ms: 250 },
                        from("d", "D1", 5, Expect::DeniedEarlierWaiter { max_ms: 10 }),
                        from("c", "C2", 5, ok),
                        // c served passes it to d (its time: when it asks again, 10 ms on);
                        // b, asking again, waits behind d.
                        from("b", "B3", 5, Expect::DeniedEarlierWaiter { max_ms: 20 }),
                        from("d", "D1", 5, ok),
                    ]
                },
            )
        },
        case(
            "budget turn: a refusal longer than the turn's horizon takes no turn",
            vec![
                // 0 of 1,000 tokens left, full in 10 s: a token every 10 ms.
                refilling(None, Some((0, 10_000, 1_000)), 0),
                // a needs 500: 5 s away, past the 2 s horizon; its waiter may well leave first.
                from("a", "A", 500, Expect::DeniedProviderWindow { max_ms: 5_000 }),
                Step::Advance { ms: 200 },
                // b's 10 fit now and are served.
                from("b", "B", 10, Expect::Granted { wave: 1, state: WaveState::Normal, limit: 10 }),
            ],
        ),
        case(
            "provider window: OpenAI's reset is a refill: what is left grows back toward the limit",
            vec![
                // 0 of 10 left, full again in 1 s: one request back every 100 ms.
                refilling(Some((0, 1_000, 10)), None, 0),
                denied_window("A", 0, 100),
                Step::Advance { ms: 100 },
                granted("A", 1, Normal, 10),
                finish("A", Success),
                denied_window("B", 0, 100),
                // Half a second later, half the bucket is back: 5 may go at once, not 0.
                Step::Advance { ms: 500 },
                granted("B", 1, Normal, 10),
                granted("C", 1, Normal, 10),
                granted("D", 1, Normal, 10),
                granted("E", 1, Normal, 10),
                granted("F", 1, Normal, 10),
                denied_window("G", 0, 100),
            ],
        ),
        case(
            "provider window: a refilled tokens bucket grows back too; an older answer never raises it",
            vec![
                // 100 of 1,000 tokens left, full in 900 ms: one token a millisecond.
                refilling(None, Some((100, 900, 1_000)), 0),
                with_tokens("A", 100),
                denied_window("B", 50, 50),
                // A late answer saying more is left changes nothing.
                refilling(None, Some((600, 400, 1_000)), 0),
                denied_window("B", 50, 50),
                Step::Advance { ms: 50 },
                with_tokens("B", 50),
                // A fixed end is kept as it is (Anthropic): nothing grows back before it.
                window(None, Some((0, 300)), 0),
                Step::Advance { ms: 200 },
                denied_window("C", 1, 100),
            ],
        ),
        case(
            "provider window: an OpenAI-style answer full when a running fixed window ends is that window",
            vec![
                // A fixed window: 2 left until 1 s (its first answers proved it fixed).
                window(Some((2, 1_000)), None, 0),
                granted("A", 1, Normal, 10),
                granted("B", 1, Normal, 10),
                Step::Advance { ms: 500 },
                // 0 of 10 left, "full" in 500 ms: when the window ends. Read as a refill, 5
                // would be back in 250 ms; the provider gives nothing before the end.
                refilling(Some((0, 500, 10)), None, 0),
                Step::Advance { ms: 250 },
                denied_window("C", 0, 250),
                Step::Advance { ms: 250 },
                granted("C", 1, Normal, 10),
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
