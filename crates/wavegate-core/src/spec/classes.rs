//! The tables of the choice across processes: several processes (instances) waiting at one
//! gate, each asking with its heads at once (one per class, or per tenant within a class).
//!
//! Asks whose order in time matters are a few milliseconds apart (`Advance`), so a twin on a
//! real clock sees the same order as one on a manual clock.

use super::waves::{LEASE_MS, case, status};
use super::{Expect, SpecAsk, SpecCase, SpecClass, SpecSignal, Step, Wakes};
use crate::wave::WaveState::{Cooldown, Normal};

fn class(name: &'static str, weight: u32) -> SpecClass {
    SpecClass { name, weight, reserve_percent: 0, budget_percent: 100 }
}

fn reserved(name: &'static str, weight: u32, reserve_percent: u8) -> SpecClass {
    SpecClass { reserve_percent, ..class(name, weight) }
}

fn capped(name: &'static str, weight: u32, budget_percent: u8) -> SpecClass {
    SpecClass { budget_percent, ..class(name, weight) }
}

/// A case at limit `limit` with `classes`.
fn classed(name: &'static str, limit: u32, classes: Vec<SpecClass>, steps: Vec<Step>) -> SpecCase {
    SpecCase { base_limit: limit, classes, ..case(name, steps) }
}

/// A head of `waiting` callers of `class`, reserving no tokens, naming no tenant.
fn ask(permit: &'static str, class: &'static str, waiting: u32) -> SpecAsk {
    SpecAsk { permit, class, tenant: None, tokens: 0, waiting }
}

fn tokens(ask: SpecAsk, tokens: u64) -> SpecAsk {
    SpecAsk { tokens, ..ask }
}

fn tenant(ask: SpecAsk, tenant: &'static str) -> SpecAsk {
    SpecAsk { tenant: Some(tenant), ..ask }
}

fn among(instance: &'static str, asks: Vec<SpecAsk>, answers: &'static str, expect: Expect) -> Step {
    Step::AcquireAmong { instance, asks, answers, expect }
}

/// `instance` asks with `asks`, and `answers` is granted in wave 1, NORMAL, at `limit`.
fn granted(instance: &'static str, asks: Vec<SpecAsk>, answers: &'static str, limit: u32) -> Step {
    among(instance, asks, answers, Expect::Granted { wave: 1, state: Normal, limit })
}

fn waits(instance: &'static str, asks: Vec<SpecAsk>, answers: &'static str) -> Step {
    among(instance, asks, answers, Expect::DeniedAtLimit)
}

/// `permit` ends with success; the release wakes `wakes`.
fn done(permit: &'static str, wakes: Wakes) -> Step {
    Step::Finish { permit, wave: None, signal: SpecSignal::Success, token_delta: 0, held: true, wakes }
}

fn later() -> Step {
    Step::Advance { ms: 5 }
}

fn classes_now(classes: &[(u32, u32)]) -> Step {
    Step::ClassStatus { classes: classes.to_vec() }
}

pub(super) fn cases() -> Vec<SpecCase> {
    use Wakes::{Hands, Instance, Nobody};
    let two = || vec![class("interactive", 3), class("batch", 1)];
    vec![
        classed(
            "no classes: a release hands the freed permit to the last ask of the process that has waited longest",
            1,
            Vec::new(),
            vec![
                Step::AcquireAmong {
                    instance: "alpha",
                    asks: vec![ask("a1", "x", 1)],
                    answers: "a1",
                    expect: Expect::Granted { wave: 1, state: Normal, limit: 1 },
                },
                waits("beta", vec![ask("b0", "x", 1)], "b0"),
                // Its caller left: the next ask replaces it.
                waits("beta", vec![ask("b1", "x", 1)], "b1"),
                later(),
                waits("gamma", vec![ask("c1", "x", 1)], "c1"),
                Step::Finish {
                    permit: "ghost",
                    wave: Some(1),
                    signal: SpecSignal::Neutral,
                    token_delta: 0,
                    held: false,
                    wakes: Nobody,
                },
                // The woken process is granted in the release: whoever asks first finds no room.
                done("a1", Hands("beta", "b1")),
                waits("gamma", vec![ask("c1", "x", 1)], "c1"),
                status(Normal, 1, 1, 1),
                // The woken process asks again with the same id (its wake-up was lost): the same
                // permit, not a second one.
                granted("beta", vec![ask("b1", "x", 1)], "b1", 1),
                status(Normal, 1, 1, 1),
                later(),
                waits("beta", vec![ask("b2", "x", 1)], "b2"),
                done("b1", Hands("gamma", "c1")),
                done("c1", Hands("beta", "b2")),
                // Nobody waits: nobody is woken, nothing is handed.
                done("b2", Nobody),
                status(Normal, 1, 1, 0),
            ],
        ),
        classed(
            "no classes: a release the wave holds back after it wakes the process without a permit",
            1,
            Vec::new(),
            vec![
                granted("alpha", vec![ask("a1", "x", 1)], "a1", 1),
                waits("beta", vec![ask("b1", "x", 1)], "b1"),
                Step::Finish {
                    permit: "a1",
                    wave: None,
                    signal: SpecSignal::RateLimited(Some(400)),
                    token_delta: 0,
                    held: true,
                    wakes: Instance("beta"),
                },
                status(Cooldown, 1, 2, 0),
            ],
        ),
        SpecCase {
            requests_per_minute: Some((600, 10)),
            ..classed(
                "no classes: with a rate budget in force a release wakes the process without a permit",
                1,
                Vec::new(),
                vec![
                    granted("alpha", vec![ask("a1", "x", 1)], "a1", 1),
                    waits("beta", vec![ask("b1", "x", 1)], "b1"),
                    done("a1", Instance("beta")),
                    granted("beta", vec![ask("b1", "x", 1)], "b1", 1),
                    status(Normal, 1, 1, 1),
                ],
            )
        },
        classed(
            "classes: a freed permit goes to the class below its share, whichever process asks first",
            2,
            two(),
            vec![
                granted("beta", vec![ask("b1", "batch", 50)], "b1", 2),
                granted("beta", vec![ask("b2", "batch", 49)], "b2", 2),
                waits("beta", vec![ask("b3", "batch", 48)], "b3"),
                waits("alpha", vec![ask("i1", "interactive", 1)], "i1"),
                classes_now(&[(0, 1), (2, 48)]),
                done("b1", Instance("alpha")),
                // beta asks again at once, but the permit is interactive's.
                waits("beta", vec![ask("b3", "batch", 48)], "b3"),
                granted("alpha", vec![ask("i1", "interactive", 1)], "i1", 2),
                classes_now(&[(1, 0), (1, 48)]),
                // Interactive waits no more: the next free permit is batch's.
                done("b2", Instance("beta")),
                granted("beta", vec![ask("b3", "batch", 48)], "b3", 2),
                // Asked again with a granted id: the same permit, not a second one.
                granted("beta", vec![ask("b3", "batch", 47)], "b3", 2),
                status(Normal, 2, 1, 2),
            ],
        ),
        SpecCase {
            tokens_per_minute: Some((60_000, 1_000)),
            ..classed(
                "never fits: an oversized head of a later class fails only itself, naming it, and stalls nobody",
                2,
                vec![class("interactive", 3), reserved("batch", 1, 50), capped("bulk", 1, 50)],
                vec![
                    // Batch, below its reserve, is the class the choice would reach; its
                    // head can never fit the burst of 1,000: the refusal names it, not the
                    // innocent interactive caller asked first.
                    among(
                        "alpha",
                        vec![tokens(ask("i1", "interactive", 1), 100), tokens(ask("huge", "batch", 1), 5_000)],
                        "huge",
                        Expect::DeniedTooLarge,
                    ),
                    // Nothing was written or charged: another process's caller and alpha's
                    // innocent one are served at once.
                    granted("beta", vec![tokens(ask("b1", "batch", 1), 100)], "b1", 2),
                    granted("alpha", vec![tokens(ask("i1", "interactive", 1), 100)], "i1", 2),
                    classes_now(&[(1, 0), (1, 0), (0, 0)]),
                    done("i1", Nobody),
                    // A class with a budget share: its own burst (500) is the one in force.
                    among(
                        "alpha",
                        vec![tokens(ask("i2", "interactive", 1), 600), tokens(ask("bulky", "bulk", 1), 600)],
                        "bulky",
                        Expect::DeniedTooLarge,
                    ),
                    granted("alpha", vec![tokens(ask("i2", "interactive", 1), 600)], "i2", 2),
                    // Alone, too: refused at the limit as at any time.
                    among("gamma", vec![tokens(ask("g1", "bulk", 1), 501)], "g1", Expect::DeniedTooLarge),
                    status(Normal, 2, 1, 2),
                ],
            )
        },
        classed(
            "classes: weights 3 : 1 at limit 1 across two processes: three grants to one, the waker named each time",
            1,
            two(),
            vec![
                granted("alpha", vec![ask("i1", "interactive", 9)], "i1", 1),
                later(),
                waits("beta", vec![ask("b1", "batch", 9)], "b1"),
                later(),
                done("i1", Instance("alpha")),
                waits("beta", vec![ask("b1", "batch", 9)], "b1"),
                later(),
                granted("alpha", vec![ask("i2", "interactive", 8)], "i2", 1),
                later(),
                done("i2", Instance("alpha")),
                granted("alpha", vec![ask("i3", "interactive", 7)], "i3", 1),
                later(),
                // Interactive's pass after a fourth grant ties batch's: batch waited longer.
                done("i3", Instance("beta")),
                waits("alpha", vec![ask("i4", "interactive", 6)], "i4"),
                later(),
                granted("beta", vec![ask("b1", "batch", 9)], "b1", 1),
                later(),
                done("b1", Instance("alpha")),
                granted("alpha", vec![ask("i4", "interactive", 6)], "i4", 1),
                classes_now(&[(1, 5), (0, 8)]),
            ],
        ),
        classed(
            "classes: one ask for several classes gets the one the fleet reaches, and a resent one the same permit",
            2,
            vec![class("interactive", 1), class("batch", 1)],
            vec![
                // A full tie: the class listed first.
                granted("alpha", vec![ask("b1", "batch", 5), ask("i1", "interactive", 1)], "i1", 2),
                granted("alpha", vec![ask("b1", "batch", 5), ask("i1", "interactive", 1)], "i1", 2),
                granted("alpha", vec![ask("b1", "batch", 5)], "b1", 2),
                waits("alpha", vec![ask("b2", "batch", 4)], "b2"),
                classes_now(&[(1, 0), (1, 4)]),
            ],
        ),
        classed(
            "classes: below its reserve a class comes first, even when another's turn",
            3,
            vec![class("interactive", 9), reserved("batch", 1, 34)],
            vec![
                granted("alpha", vec![ask("i1", "interactive", 9)], "i1", 3),
                granted("alpha", vec![ask("i2", "interactive", 8)], "i2", 3),
                granted("alpha", vec![ask("i3", "interactive", 7)], "i3", 3),
                later(),
                waits("beta", vec![ask("b1", "batch", 2)], "b1"),
                later(),
                // Batch holds none of its reserve of one: the freed permit is its.
                done("i1", Instance("beta")),
                waits("alpha", vec![ask("i4", "interactive", 6)], "i4"),
                granted("beta", vec![ask("b1", "batch", 2)], "b1", 3),
                // At its reserve, batch takes turns by weight: interactive's (9 : 1).
                done("i2", Instance("alpha")),
                later(),
                waits("beta", vec![ask("b2", "batch", 1)], "b2"),
                granted("alpha", vec![ask("i4", "interactive", 6)], "i4", 3),
                // ... until batch is below its reserve again: then batch.
                done("b1", Instance("beta")),
                granted("beta", vec![ask("b2", "batch", 1)], "b2", 3),
            ],
        ),
        classed(
            "tenants: within a class, the tenant with the fewest permits in flight across the fleet",
            2,
            vec![class("chat", 1)],
            vec![
                granted("alpha", vec![tenant(ask("a1", "chat", 3), "acme")], "a1", 2),
                granted("beta", vec![tenant(ask("z1", "chat", 1), "zeta")], "z1", 2),
                waits("alpha", vec![tenant(ask("a2", "chat", 2), "acme")], "a2"),
                later(),
                waits("beta", vec![tenant(ask("z2", "chat", 1), "zeta")], "z2"),
                // zeta now holds none, acme one: zeta's caller (at beta) is next.
                done("z1", Instance("beta")),
                waits("alpha", vec![tenant(ask("a2", "chat", 2), "acme")], "a2"),
                granted("beta", vec![tenant(ask("z2", "chat", 1), "zeta")], "z2", 2),
                // Equal in flight: the tenant that waited longest.
                done("z2", Instance("alpha")),
                granted("alpha", vec![tenant(ask("a2", "chat", 2), "acme")], "a2", 2),
            ],
        ),
        classed(
            "tenants: one process with callers of two tenants offers both; the grant names the tenant reached",
            2,
            vec![class("chat", 1)],
            vec![
                granted("beta", vec![tenant(ask("z1", "chat", 1), "zeta")], "z1", 2),
                granted(
                    "alpha",
                    vec![tenant(ask("a1", "chat", 4), "acme"), tenant(ask("y1", "chat", 1), "yak")],
                    "a1",
                    2,
                ),
                // alpha still waits, for acme and for yak: the release wakes it.
                done("a1", Instance("alpha")),
                later(),
                waits("beta", vec![tenant(ask("z2", "chat", 1), "zeta")], "z2"),
                // acme and yak hold none, zeta one: acme and yak tie (in flight, and since,
                // one process's offers); the tenant listed first (by tag: acme's
                // 0724d383..., yak's b54d7a19...) is next.
                granted(
                    "alpha",
                    vec![tenant(ask("a2", "chat", 3), "acme"), tenant(ask("y1", "chat", 1), "yak")],
                    "a2",
                    2,
                ),
                done("a2", Instance("alpha")),
                // The ask's order does not matter, only the tenants'.
                granted(
                    "alpha",
                    vec![tenant(ask("y1", "chat", 1), "yak"), tenant(ask("a3", "chat", 2), "acme")],
                    "a3",
                    2,
                ),
                classes_now(&[(2, 3)]),
            ],
        ),
        SpecCase {
            requests_per_minute: Some((600, 2)),
            ..classed(
                "class budgets: a class whose own budget is spent takes no part; the permit goes to another class",
                2,
                vec![class("interactive", 1), capped("batch", 1, 50)],
                vec![
                    // Batch may use half the budget: 300 a minute, bursts of 1.
                    granted("alpha", vec![ask("b1", "batch", 5)], "b1", 2),
                    waits("alpha", vec![ask("b2", "batch", 4)], "b2"),
                    later(),
                    granted("beta", vec![ask("i1", "interactive", 1)], "i1", 2),
                    // Batch's waiting callers take no part while its budget is spent.
                    done("b1", Nobody),
                    // The upstream's budget is spent too now (2 in a burst); the refused
                    // caller waits on the list.
                    among("beta", vec![ask("i2", "interactive", 1)], "i2", Expect::DeniedRequests),
                    Step::Advance { ms: 210 },
                    // 100 ms a request upstream, 200 ms for batch: both have room again, and
                    // batch, back in the choice, waited longer (the same pass after the grant).
                    granted("alpha", vec![ask("b2", "batch", 4)], "b2", 2),
                    waits("beta", vec![ask("i2", "interactive", 1)], "i2"),
                ],
            )
        },
        SpecCase {
            requests_per_minute: Some((6_000, 4)),
            ..classed(
                "class budgets: a capped class's share is of the budget in force, a learned limit included",
                4,
                vec![class("interactive", 1), capped("batch", 1, 50)],
                vec![
                    // The provider announces 2 per 200 ms: 600 a minute, bursts of 2, tighter
                    // than the configured 6,000 with bursts of 4.
                    Step::ReportWindow {
                        by: None,
                        requests: None,
                        tokens: None,
                        tokens_each: 0,
                        learned_requests: Some((2, 200)),
                        learned_tokens: None,
                        learned_parts: [None; 2],
                        refills_requests: None,
                        refills_tokens: None,
                        parts: [None; 2],
                        refused: None,
                    },
                    // Batch's share is half of that: bursts of 1 (half the configured would be 2).
                    granted("alpha", vec![ask("b1", "batch", 2)], "b1", 4),
                    waits("alpha", vec![ask("b2", "batch", 1)], "b2"),
                    later(),
                    granted("beta", vec![ask("i1", "interactive", 1)], "i1", 4),
                ],
            )
        },
        SpecCase {
            tokens_per_minute: Some((60_000, 1_000)),
            ..classed(
                "a denial names the ask the choice reached: a budget's refusal of a later class's head",
                2,
                vec![class("interactive", 1), reserved("batch", 1, 50)],
                vec![
                    granted("alpha", vec![tokens(ask("i0", "interactive", 1), 995)], "i0", 2),
                    among(
                        "alpha",
                        vec![tokens(ask("i1", "interactive", 1), 900), tokens(ask("b1", "batch", 1), 10)],
                        "b1",
                        Expect::DeniedTokens,
                    ),
                    Step::Advance { ms: 20 },
                    granted(
                        "alpha",
                        vec![tokens(ask("i1", "interactive", 1), 900), tokens(ask("b1", "batch", 1), 10)],
                        "b1",
                        2,
                    ),
                ],
            )
        },
        SpecCase {
            class_window_ms: LEASE_MS - 100,
            ..classed(
                "count window: a permit not renewed lately stops counting for its class's reserve, and counts again once renewed",
                2,
                vec![class("interactive", 2), reserved("batch", 1, 50)],
                vec![
                    granted("alpha", vec![ask("b1", "batch", 2)], "b1", 2),
                    Step::Advance { ms: 200 },
                    // b1 has not been renewed for 200 ms: batch counts as holding none of its
                    // reserve, and its waiting caller takes the free permit.
                    waits("beta", vec![ask("i1", "interactive", 1)], "i1"),
                    classes_now(&[(0, 1), (1, 1)]),
                    Step::Renew { permits: vec!["b1"], again: vec![] },
                    // Renewed: batch holds its reserve; interactive's turn (weight 2).
                    granted("beta", vec![ask("i1", "interactive", 1)], "i1", 2),
                    // A permit no longer held is registered again by a renewal.
                    Step::Finish {
                        permit: "b1",
                        wave: None,
                        signal: SpecSignal::Neutral,
                        token_delta: 0,
                        held: true,
                        wakes: Wakes::Unchecked,
                    },
                    Step::Renew { permits: vec!["b1", "i1"], again: vec!["b1"] },
                    status(Normal, 2, 1, 2),
                ],
            )
        },
        classed(
            "freshness: a process that stopped asking holds the permit back no longer than 1.5 s",
            1,
            vec![class("interactive", 1), class("batch", 1)],
            vec![
                granted("alpha", vec![ask("b1", "batch", 2)], "b1", 1),
                waits("beta", vec![ask("i1", "interactive", 1)], "i1"),
                done("b1", Instance("beta")),
                // beta never asks again (it died): the free permit waits for it ...
                waits("alpha", vec![ask("b2", "batch", 1)], "b2"),
                Step::Advance { ms: 1_600 },
                // ... until its place is stale.
                granted("alpha", vec![ask("b2", "batch", 1)], "b2", 1),
            ],
        ),
    ]
}
