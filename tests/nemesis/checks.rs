//! The drawn run's checks, from the provider's own record of every call (docs/guarantees.md,
//! "The nemesis run"): calls at once against each moment's bound, the requests and tokens
//! budgets and the capped classes' shares in every window, no class starved, no pause longer
//! than its clamp, a spent quota honoured, full throughput soon after the last fault.

use std::sync::MutexGuard;

use wavegate::Mode;

use crate::draw::Drawn;
use crate::fleet::{self, FaultKind, Life, SWITCH_WINDOW_MS};

/// One call as the provider saw it (unix ms).
#[derive(Debug, Clone)]
pub(crate) struct Call {
    pub(crate) arrived: u64,
    pub(crate) ended: u64,
    pub(crate) status: u16,
    pub(crate) tokens: u64,
    pub(crate) class: String,
    pub(crate) worker: usize,
}

pub(crate) struct Run<'a> {
    pub(crate) drawn: &'a Drawn,
    pub(crate) start_ms: u64,
    pub(crate) quiet_from: u64,
    pub(crate) end_ms: u64,
    /// (begun, ended, kind) of every fault.
    pub(crate) faults: &'a [(u64, u64, FaultKind)],
    pub(crate) lives: &'a [MutexGuard<'a, Life>],
    pub(crate) quota_told: &'a [(u64, usize)],
}

/// A grant reaches the provider up to this long after the store made it (its reply, the
/// caller's wake-up, the HTTP request, on a loaded machine): the budgets bound grants in any
/// window on the store's clock, so arrivals in a window come from grants in one this much longer.
const DELIVERY_MS: u64 = 50;

/// A fault disturbs from 300 ms before it until this long after it ends (a reconciliation
/// after a probe, then 1.5 s within the share).
const DISTURBED_AFTER_MS: u64 = 3_000;

pub(crate) fn all(run: &Run<'_>, calls: &[Call]) -> Vec<String> {
    let mut broken = Vec::new();
    let d = run.drawn;
    let rel = |t: u64| t.saturating_sub(run.start_ms);

    // The limit.
    let spans: Vec<(u64, u64)> = calls.iter().filter(|c| c.status == 200).map(|c| (c.arrived, c.ended)).collect();
    let service = d.service.as_millis() as u64;
    let peaks = fleet::concurrency(
        &spans,
        run.lives,
        d.limit as usize,
        0,
        run.start_ms,
        SWITCH_WINDOW_MS.max(service + 200),
        service + 100,
    );
    println!(
        "      most at once at the provider (limit {}): shared {}, all in fallback {}, partial {}, within a switch ({} changes of mode) {}",
        d.limit, peaks.shared, peaks.fallback, peaks.partial, peaks.switches, peaks.switching
    );
    if !peaks.violations.is_empty() {
        let n = peaks.violations.len();
        broken.push(format!("{n} moments over the bound, e.g. {:?}", &peaks.violations[..n.min(5)]));
    }
    if !peaks.shares_over.is_empty() {
        broken.push(format!(
            "fallback shares over the limit: {:?}",
            &peaks.shares_over[..peaks.shares_over.len().min(5)]
        ));
    }

    // The budgets, in every window of 1 s and 5 s that starts at a call: `rate × w + burst` where
    // no fault or change of mode is near; near one, a state lost (an empty restart, FLUSHALL)
    // may hand out its burst once more, each process in fallback one share's burst more, and in
    // a partial outage each process cut off its whole share (rate and burst) beside the fleet.
    let changes: Vec<u64> = run.lives.iter().flat_map(|l| l.modes.iter().skip(1).map(|m| m.0)).collect();
    let disturbed = |from: u64, to: u64| {
        run.faults.iter().any(|&(a, b, _)| from < b + DISTURBED_AFTER_MS && a < to + 300)
            || changes.iter().any(|&c| from < c + DISTURBED_AFTER_MS && c < to + 300)
    };
    let lost_in = |from: u64, to: u64| {
        run.faults
            .iter()
            .filter(|&&(a, _, k)| {
                matches!(k, FaultKind::RedisKillRestart | FaultKind::FlushAll) && a < to && a + 60_000 > from
            })
            .count() as f64
    };
    // A partial outage: the processes still sharing Redis spend the fleet's whole budget while
    // each one cut off spends its fallback share of it on top (guarantees.md: "each such process
    // adds up to one share"). The fraction of the fleet cut off at some moment of the window,
    // when the others were not.
    let cut_off_beside_shared = |from: u64, to: u64| {
        let alive: Vec<&Life> = run
            .lives
            .iter()
            .map(|l| &**l)
            .filter(|l| l.spawned_ms < to && l.killed_ms.is_none_or(|k| k >= from))
            .collect();
        let fell = |l: &Life| {
            l.mode_at(from).0 == Mode::Fallback
                || l.modes.iter().any(|&(at, mode, _)| from <= at && at < to && mode == Mode::Fallback)
        };
        let cut_off = alive.iter().filter(|l| fell(l)).count();
        if cut_off == 0 || cut_off == alive.len() { 0.0 } else { cut_off as f64 / alive.len() as f64 }
    };
    let mut budget_report = Vec::new();
    let whole_run = run.end_ms.saturating_sub(run.start_ms) + 1;
    let mut check_budget = |name: &str,
                            (per_ms, burst): (f64, f64),
                            weight: &dyn Fn(&Call) -> Option<u64>,
                            share: f64,
                            windows: &[u64]| {
        let rate = per_ms * share;
        let burst = (burst * share).ceil();
        let counted: Vec<(u64, u64)> = calls.iter().filter_map(|c| weight(c).map(|w| (c.arrived, w))).collect();
        let (mut worst_clean, mut worst_disturbed) = (0.0f64, 0.0f64);
        for &w in windows {
            let mut j = 0;
            let mut sum = 0u64;
            for i in 0..counted.len() {
                let from = counted[i].0;
                while j < counted.len() && counted[j].0 < from + w {
                    sum += counted[j].1;
                    j += 1;
                }
                let clean_bound = rate * (w + DELIVERY_MS) as f64 + burst + 1.0;
                let used = sum as f64;
                if disturbed(from, from + w) {
                    let bound = clean_bound
                        + burst * lost_in(from, from + w)
                        + burst
                        + (rate * w as f64 + burst) * cut_off_beside_shared(from, from + w)
                        + run.lives.len() as f64 * d.estimate.1 as f64;
                    worst_disturbed = worst_disturbed.max(used / clean_bound);
                    if used > bound {
                        broken.push(format!(
                            "{name}: {used} in {w} ms from +{} ms (near a fault; bound {bound:.0})",
                            rel(from)
                        ));
                    }
                } else {
                    worst_clean = worst_clean.max(used / clean_bound);
                    if used > clean_bound {
                        broken
                            .push(format!("{name}: {used} in {w} ms from +{} ms (bound {clean_bound:.0})", rel(from)));
                    }
                }
                sum -= counted[i].1;
            }
        }
        budget_report.push(format!(
            "{name} {:.0} %/{:.0} % of rate × w + burst (clean/near a fault)",
            worst_clean * 100.0,
            worst_disturbed * 100.0
        ));
    };
    let mut sorted = calls.to_vec();
    sorted.sort_by_key(|c| c.arrived);
    let calls = &sorted[..];
    let minute = |(per_minute, burst): (u32, u32)| (f64::from(per_minute) / 60_000.0, f64::from(burst));
    let windows = [1_000u64, 5_000];
    if let Some(budget) = d.rpm {
        check_budget("requests", minute(budget), &|_| Some(1), 1.0, &windows);
        for class in d.classes.iter().filter(|c| c.budget < 100) {
            let name = class.name.clone();
            check_budget(
                &format!("requests of {name}"),
                minute(budget),
                &|c| (c.class == name).then_some(1),
                f64::from(class.budget) / 100.0,
                &windows,
            );
        }
    }
    if let Some(budget) = d.tpm {
        check_budget("tokens", minute(budget), &|c| (c.status == 200).then_some(c.tokens), 1.0, &windows);
        for class in d.classes.iter().filter(|c| c.budget < 100) {
            let name = class.name.clone();
            check_budget(
                &format!("tokens of {name}"),
                minute(budget),
                &|c| (c.status == 200 && c.class == name).then_some(c.tokens),
                f64::from(class.budget) / 100.0,
                &windows,
            );
        }
    }
    // The day: in every 5 s and over the whole run, through every fault (a fallback's share
    // starts from what the store last said is left; an outage's usage is charged back).
    if let Some((per_day, burst)) = d.rpd {
        let day = (per_day as f64 / 86_400_000.0, burst as f64);
        check_budget("requests per day", day, &|_| Some(1), 1.0, &[5_000, whole_run]);
    }
    if !budget_report.is_empty() {
        println!("      budgets, most used: {}", budget_report.join("; "));
    }

    // No class starved: between two calls of a class, at most so many of the others (its
    // weighted turn in every process, the calls already granted, and what its budget share
    // makes it wait).
    if d.classes.len() > 1 {
        let mut report = Vec::new();
        for class in &d.classes {
            let turn = (f64::from(d.weight_sum()) / f64::from(class.weight)).ceil() as usize;
            let ratio = if d.tpm.is_some() { d.estimate.1 as f64 / d.estimate.0 as f64 } else { 1.0 };
            let budget =
                if class.budget < 100 { (100.0 / f64::from(class.budget) * ratio * 2.0).ceil() as usize } else { 0 };
            let bound = run.lives.len() * (2 * turn + d.limit as usize) + budget;
            let (mut run_of_others, mut worst, mut at) = (0usize, 0usize, 0u64);
            for c in calls.iter().filter(|c| c.arrived < run.quiet_from) {
                if c.class == class.name {
                    run_of_others = 0;
                } else {
                    run_of_others += 1;
                    if run_of_others > worst {
                        (worst, at) = (run_of_others, c.arrived);
                    }
                }
            }
            report.push(format!("{} {worst} (bound {bound})", class.name));
            if worst > bound {
                broken.push(format!(
                    "class {} starved: {worst} calls of others in a row, up to +{} ms (bound {bound})",
                    class.name,
                    rel(at)
                ));
            }
        }
        println!("      most calls of other classes between two of one class: {}", report.join(", "));
    }

    // No pause longer than its clamp: a `Retry-After` alone by max_cooldown, a reset by the
    // provider's window and its clock's skew, a spent quota by quota_pause, plus what the
    // budgets make a caller wait and a second of looking again.
    let window = d.window.as_millis() as f64 + d.skew_ms.max(0) as f64 + 1_000.0;
    let clamp = (d.max_cooldown.as_millis() as f64).max(window).max(d.quota_pause.as_millis() as f64);
    let budget_gap = d.rpm.map_or(0.0, |(pm, _)| 60_000.0 / f64::from(pm))
        + d.tpm.map_or(0.0, |(pm, _)| d.estimate.1 as f64 * 60_000.0 / f64::from(pm))
        + d.rpd.map_or(0.0, |(pd, _)| 86_400_000.0 / pd as f64);
    let bound = clamp + budget_gap + 1_500.0;
    let (mut longest, mut longest_at) = (0u64, 0u64);
    for pair in calls.windows(2).filter(|p| p[0].arrived >= run.start_ms + 1_000 && p[1].arrived <= run.end_ms) {
        let gap = pair[1].arrived - pair[0].arrived;
        if gap > longest {
            (longest, longest_at) = (gap, pair[0].arrived);
        }
    }
    println!(
        "      longest pause at the provider: {longest} ms from +{} ms (clamp {clamp:.0} ms; bound with budgets and the look-again pace {bound:.0} ms)",
        rel(longest_at)
    );
    if longest as f64 > bound {
        broken.push(format!(
            "a pause of {longest} ms from +{} ms, longer than its clamp ({bound:.0} ms)",
            rel(longest_at)
        ));
    }

    // A spent quota is honoured: the process told sends nothing more for its quota pause (the
    // calls it had already granted aside).
    let pause = d.quota_pause.as_millis() as u64;
    let mut ignored = Vec::new();
    for &(t, w) in run.quota_told {
        let respawned = run.faults.iter().any(|&(a, _, k)| k == FaultKind::WorkerKill && a + 100 >= t && a < t + pause);
        let from = t + service + 500;
        let sent = calls.iter().filter(|c| c.worker == w && c.arrived > from && c.arrived + 200 < t + pause).count();
        if sent > 0 && !respawned {
            ignored
                .push(format!("worker {w} sent {sent} calls in the {pause} ms after a spent quota at +{} ms", rel(t)));
        }
    }
    println!("      spent quotas told: {}, ignored: {}", run.quota_told.len(), ignored.len());
    if !ignored.is_empty() {
        broken.push(format!("{} spent quotas ignored, e.g. {:?}", ignored.len(), &ignored[..ignored.len().min(3)]));
    }

    // Full throughput soon after the last fault: the first second after it that serves at
    // least 80 % of the last 3 s's rate, within the pause clamp and 3 s.
    let last_fault = run.faults.iter().map(|f| f.1).max().unwrap_or(run.start_ms);
    let served: Vec<u64> = calls.iter().filter(|c| c.status == 200).map(|c| c.arrived).collect();
    let rate = |from: u64, to: u64| {
        served.iter().filter(|t| (from..to).contains(*t)).count() as f64 * 1e3 / (to - from) as f64
    };
    let steady = rate(run.end_ms - 3_000, run.end_ms);
    let full_at = (last_fault..run.end_ms - 1_000).step_by(100).find(|&t| rate(t, t + 1_000) >= 0.8 * steady);
    let took = full_at.map(|t| t - last_fault);
    println!(
        "      throughput: {steady:.0} calls/s in the last 3 s; 80 % of it {} after the last fault (bound {:.0} ms)",
        took.map_or("never".to_string(), |t| format!("{t} ms")),
        clamp + 3_000.0
    );
    if took.is_none_or(|t| t as f64 > clamp + 3_000.0) {
        broken.push(format!(
            "throughput not back to 80 % of {steady:.0}/s within {:.0} ms of the last fault",
            clamp + 3_000.0
        ));
    }
    broken
}
