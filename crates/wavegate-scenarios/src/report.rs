//! What one run recorded, and the table row it makes.
//!
//! Definitions (the same for every strategy):
//! * **success**: jobs that got a 200, over the jobs given to workers that were not killed
//!   (a killed worker's jobs in progress are lost by definition and left out);
//! * **attempts**: requests the provider received (its own records), 429s included;
//! * **completion**: from the start signal to the last job's end; **× ideal**: over
//!   Σ service time ÷ provider capacity, for the same jobs;
//! * **queue wait**: per successful job, from the moment a caller took it to the moment the
//!   attempt that succeeded was sent: permit or semaphore waits, backoff sleeps and failed
//!   attempts included (p50 / p99 by nearest rank);
//! * **max in flight**: the most requests the provider had open at once (429s included while
//!   they were being answered);
//! * **Redis commands per permit**: commands sent (round trips) / executed (those inside the
//!   scripts included), from `INFO commandstats`, over the attempts (each wavegate attempt
//!   holds one permit), the status poller's reads and the runner's own commands left out.

use std::fmt::Write as _;
use std::time::Duration;

use crate::protocol::{field, num};
use crate::provider::Request;
use crate::redis_stats::CommandStats;
use crate::scenario::{Event, Scenario, Sizes};
use crate::stats::{max_in_flight, percentile};

/// One job as its worker reported it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct JobDone {
    pub(crate) id: u64,
    pub(crate) ok: bool,
    pub(crate) attempts: u32,
    pub(crate) rate_limited: u32,
    pub(crate) start: u64,
    pub(crate) success_start: u64,
    pub(crate) end: u64,
}

impl JobDone {
    /// Parses a worker's `DONE` line.
    pub(crate) fn parse(line: &str) -> Option<Self> {
        Some(Self {
            id: num(line, "id")?,
            ok: num::<u8>(line, "ok")? == 1,
            attempts: num(line, "attempts")?,
            rate_limited: num(line, "r429")?,
            start: num(line, "start")?,
            success_start: num(line, "success_start")?,
            end: num(line, "end")?,
        })
    }
}

/// The scheduler's view at one moment, from the status poller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct StatusSample {
    pub(crate) t: u64,
    pub(crate) mode: String,
    pub(crate) state: String,
    pub(crate) limit: u32,
}

impl StatusSample {
    /// Parses a worker's `STATUS` line.
    pub(crate) fn parse(line: &str) -> Option<Self> {
        Some(Self {
            t: num(line, "t")?,
            mode: field(line, "mode")?.to_string(),
            state: field(line, "state")?.to_string(),
            limit: num(line, "limit")?,
        })
    }
}

/// Something the runner did to the fleet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mark {
    RedisKilled,
    RedisRestarted,
    WorkerKilled,
}

/// The crash scenario's victim.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Crash {
    pub(crate) pid: u32,
    /// Jobs it held when it was killed (the lost ones).
    pub(crate) holding: usize,
    /// Its permits left in the shared set, and how long (s) the last of them kept capacity.
    pub(crate) permits: Option<(usize, f64)>,
}

/// What the fleet asked of Redis.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct RedisUse {
    pub(crate) stats: CommandStats,
    /// Status reads by the poller that went to Redis.
    pub(crate) status_calls: u64,
    /// What one status read costs: (sent, executed).
    pub(crate) status_cost: (f64, f64),
}

/// Everything one run of one strategy recorded.
#[derive(Debug)]
pub(crate) struct RunResult {
    pub(crate) strategy: &'static str,
    /// The start signal, µs since the epoch.
    pub(crate) t0: u64,
    /// By job id; `None` for a job never reported.
    pub(crate) jobs: Vec<Option<JobDone>>,
    /// Jobs lost with a killed worker.
    pub(crate) lost: Vec<u64>,
    pub(crate) requests: Vec<Request>,
    pub(crate) status: Vec<StatusSample>,
    pub(crate) marks: Vec<(u64, Mark)>,
    pub(crate) redis: Option<RedisUse>,
    pub(crate) crash: Option<Crash>,
    pub(crate) timed_out: bool,
    /// What an OpenAI-like provider's bucket reported (`openai-like…` scenarios).
    pub(crate) bucket: Option<crate::llm_report::BucketLog>,
    /// Streamed answers through wavegate whose settled tokens were the provider's final usage,
    /// and those whose were not.
    pub(crate) settled: (u64, u64),
    /// From the start signal to the last worker's end.
    pub(crate) completed_in: Duration,
    /// The whole run, setup included.
    pub(crate) wall: Duration,
}

impl RunResult {
    pub(crate) fn new(strategy: &'static str, t0: u64, jobs: u64) -> Self {
        Self {
            strategy,
            t0,
            jobs: vec![None; jobs as usize],
            lost: Vec::new(),
            requests: Vec::new(),
            status: Vec::new(),
            marks: Vec::new(),
            redis: None,
            crash: None,
            timed_out: false,
            bucket: None,
            settled: (0, 0),
            completed_in: Duration::ZERO,
            wall: Duration::ZERO,
        }
    }

    /// The time of the first mark of `kind`, µs since the epoch.
    pub(crate) fn mark(&self, kind: Mark) -> Option<u64> {
        self.marks.iter().find(|(_, m)| *m == kind).map(|(t, _)| *t)
    }

    /// The last job's end, in seconds after the start.
    pub(crate) fn completion_s(&self) -> f64 {
        let last = self.jobs.iter().flatten().map(|j| j.end).max().unwrap_or(self.t0);
        last.saturating_sub(self.t0) as f64 / 1e6
    }
}

/// One row of a table.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Row {
    pub(crate) strategy: &'static str,
    pub(crate) jobs: usize,
    pub(crate) succeeded: usize,
    pub(crate) attempts: usize,
    pub(crate) rate_limited: usize,
    pub(crate) completion_s: f64,
    pub(crate) ideal_s: f64,
    pub(crate) wait_p50_s: Option<f64>,
    pub(crate) wait_p99_s: Option<f64>,
    pub(crate) max_in_flight: usize,
    /// (sent, executed) per permit.
    pub(crate) redis_per_permit: Option<(f64, f64)>,
    pub(crate) timed_out: bool,
}

impl Row {
    pub(crate) fn new(scenario: &Scenario, sizes: &Sizes, result: &RunResult) -> Self {
        let service = sizes.service_times();
        let considered: Vec<u64> = (0..sizes.jobs).filter(|id| !result.lost.contains(id)).collect();
        let succeeded: Vec<JobDone> = considered
            .iter()
            .filter_map(|&id| result.jobs.get(id as usize).copied().flatten())
            .filter(|j| j.ok)
            .collect();
        let considered_service: Vec<(u64, u64)> = considered.iter().map(|&id| (id, service[id as usize])).collect();
        let mut waits: Vec<f64> =
            succeeded.iter().map(|j| j.success_start.saturating_sub(j.start) as f64 / 1e6).collect();
        // Behind nginx the provider sees only what nginx let through: count the attempts and
        // the 429s as the workers saw them.
        let behind_nginx = scenario.via_nginx;
        let attempts = if behind_nginx {
            result.jobs.iter().flatten().map(|j| j.attempts as usize).sum()
        } else {
            result.requests.len()
        };
        let redis_per_permit = result.redis.as_ref().filter(|_| attempts > 0).map(|r| {
            let polled = r.status_calls as f64;
            let sent = (r.stats.sent() as f64 - polled * r.status_cost.0).max(0.0);
            let executed = (r.stats.executed() as f64 - polled * r.status_cost.1).max(0.0);
            (sent / attempts as f64, executed / attempts as f64)
        });
        Row {
            strategy: result.strategy,
            jobs: considered.len(),
            succeeded: succeeded.len(),
            attempts,
            rate_limited: if behind_nginx {
                result.jobs.iter().flatten().map(|j| j.rate_limited as usize).sum()
            } else {
                result.requests.iter().filter(|r| r.status == 429).count()
            },
            completion_s: result.completion_s(),
            ideal_s: scenario.ideal_s(&considered_service, sizes.jobs),
            wait_p50_s: percentile(&mut waits, 50.0),
            wait_p99_s: percentile(&mut waits, 99.0),
            max_in_flight: max_in_flight(&result.requests, |_| true),
            redis_per_permit,
            timed_out: result.timed_out,
        }
    }

    pub(crate) fn success_pct(&self) -> f64 {
        if self.jobs == 0 { 0.0 } else { 100.0 * self.succeeded as f64 / self.jobs as f64 }
    }

    pub(crate) fn share_429_pct(&self) -> f64 {
        if self.attempts == 0 { 0.0 } else { 100.0 * self.rate_limited as f64 / self.attempts as f64 }
    }
}

fn seconds(value: Option<f64>) -> String {
    value.map_or("-".to_string(), |v| format!("{v:.2}"))
}

/// The scenario's table (markdown), with its notes.
pub(crate) fn table(scenario: &Scenario, sizes: &Sizes, results: &[RunResult]) -> String {
    let mut out = String::new();
    let rows: Vec<Row> = results.iter().map(|r| Row::new(scenario, sizes, r)).collect();
    let _ = writeln!(
        out,
        "| strategy | success | attempts | 429 share | completion | × ideal | queue wait p50 / p99 | max in flight | \
         Redis cmds / permit (sent / executed) |"
    );
    let _ = writeln!(out, "|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for row in &rows {
        let _ = writeln!(
            out,
            "| {} | {:.1} % ({}/{}) | {} | {:.1} % | {}{:.1} s | {:.2} | {} / {} s | {} | {} |",
            row.strategy,
            row.success_pct(),
            row.succeeded,
            row.jobs,
            row.attempts,
            row.share_429_pct(),
            if row.timed_out { "> " } else { "" },
            row.completion_s,
            row.completion_s / row.ideal_s,
            seconds(row.wait_p50_s),
            seconds(row.wait_p99_s),
            row.max_in_flight,
            row.redis_per_permit.map_or("- (no Redis)".to_string(), |(s, e)| format!("{s:.2} / {e:.1}")),
        );
    }
    let ideal = rows.first().map_or(0.0, |r| r.ideal_s);
    let _ = writeln!(out);
    let phases = scenario.capacity_phases(sizes.jobs);
    let capacity = match phases.as_slice() {
        [] if scenario.bucket.is_some_and(|b| b.is_anthropic()) => {
            "Anthropic-like buckets, input and output apart (the table below)".to_string()
        }
        [] if scenario.bucket.is_some() => "OpenAI-like buckets and a hidden cap (the table below)".to_string(),
        [] => "no concurrency cap".to_string(),
        [(_, cap)] => format!("provider capacity {cap} (hidden)"),
        phases => format!(
            "provider capacity (hidden) {}",
            phases.iter().map(|(from, cap)| format!("{cap} from call {from}")).collect::<Vec<_>>().join(", ")
        ),
    };
    let rate = scenario.rate.map_or(String::new(), |(calls, window)| format!(", at most {calls} calls per {window} s"));
    let _ = writeln!(
        out,
        "{capacity}{rate}{}, wavegate limit {}, {} processes x {} callers; ideal completion {:.1} s \
         (Σ service time ÷ capacity of its phase, or what the rate window lets through)",
        if scenario.plain_429 { ", plain 429s (no Retry-After)" } else { "" },
        scenario.limit,
        sizes.processes,
        sizes.callers,
        ideal
    );
    if let Some(oracle) = rows.iter().find(|r| r.strategy == "oracle").filter(|r| r.completion_s > 0.0) {
        for row in rows.iter().filter(|r| r.strategy != "oracle") {
            let _ = writeln!(
                out,
                "- {}: completion {:.2} × the oracle's",
                row.strategy,
                row.completion_s / oracle.completion_s
            );
        }
    }
    for result in results {
        for note in notes(scenario, result) {
            let _ = writeln!(out, "- {}: {note}", result.strategy);
        }
    }
    out
}

/// The median of `values` (the lower middle for an even count); `None` when empty.
fn median(mut values: Vec<f64>) -> Option<f64> {
    values.sort_by(f64::total_cmp);
    values.get(values.len().saturating_sub(1) / 2).copied()
}

/// The medians over several runs of one scenario (each a row per strategy; a reference
/// strategy may be in the first run only): completion over the oracle's of the same run, over
/// the ideal, the 429 share, the success.
pub(crate) fn medians(runs: &[Vec<Row>]) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "medians of {} runs (ratios within each run):", runs.len());
    let _ = writeln!(out);
    let _ = writeln!(out, "| strategy | completion × oracle | × ideal | 429 share | success | queue wait p99 |");
    let _ = writeln!(out, "|---|---:|---:|---:|---:|---:|");
    let Some(first) = runs.first() else { return out };
    for row in first {
        let of = |f: &dyn Fn(&[Row], &Row) -> Option<f64>| {
            median(
                runs.iter()
                    .filter_map(|run| run.iter().find(|r| r.strategy == row.strategy).and_then(|r| f(run, r)))
                    .collect(),
            )
        };
        let rounds = runs.iter().filter(|run| run.iter().any(|r| r.strategy == row.strategy)).count();
        let oracle = of(&|run, r| {
            let oracle = run.iter().find(|o| o.strategy == "oracle")?;
            (oracle.completion_s > 0.0).then(|| r.completion_s / oracle.completion_s)
        });
        let ideal = of(&|_, r| Some(r.completion_s / r.ideal_s));
        let share = of(&|_, r| Some(r.share_429_pct()));
        let success = of(&|_, r| Some(r.success_pct()));
        let p99 = of(&|_, r| r.wait_p99_s);
        let _ = writeln!(
            out,
            "| {} ({rounds} run{}) | {} | {} | {} | {} | {} s |",
            row.strategy,
            if rounds == 1 { "" } else { "s" },
            oracle.map_or("-".to_string(), |v| format!("{v:.2}")),
            ideal.map_or("-".to_string(), |v| format!("{v:.2}")),
            share.map_or("-".to_string(), |v| format!("{v:.2} %")),
            success.map_or("-".to_string(), |v| format!("{v:.1} %")),
            seconds(p99),
        );
    }
    out
}

/// What a table row cannot say: the event's effect on this strategy.
fn notes(scenario: &Scenario, result: &RunResult) -> Vec<String> {
    let mut notes = Vec::new();
    let at = |t: u64| t.saturating_sub(result.t0) as f64 / 1e6;
    match scenario.event {
        Event::Nothing => {}
        Event::RedisOutage { .. } => {
            if let (Some(killed), Some(restarted)) = (result.mark(Mark::RedisKilled), result.mark(Mark::RedisRestarted))
            {
                let window = |from: u64, to: u64| -> (usize, usize, usize) {
                    let inside: Vec<Request> =
                        result.requests.iter().filter(|r| r.end > from && r.start < to).copied().collect();
                    let started = inside.iter().filter(|r| r.start >= from);
                    let rate_limited = started.clone().filter(|r| r.status == 429).count();
                    (max_in_flight(&inside, |_| true), started.count(), rate_limited)
                };
                let (before, during, after) =
                    (window(0, killed), window(killed, restarted), window(restarted, u64::MAX));
                let mut note = format!(
                    "Redis down from {:.1} s to {:.1} s; max in flight / requests / 429s before the kill {} / {} / {}, \
                     during the outage {} / {} / {}, after the restart {} / {} / {}",
                    at(killed),
                    at(restarted),
                    before.0,
                    before.1,
                    before.2,
                    during.0,
                    during.1,
                    during.2,
                    after.0,
                    after.1,
                    after.2
                );
                if !result.status.is_empty() {
                    let first = |after: u64, mode: &str| {
                        result
                            .status
                            .iter()
                            .find(|s| s.t >= after && s.mode == mode)
                            .map(|s| (s.t - after) as f64 / 1e6)
                    };
                    let _ = write!(
                        note,
                        "; the polled worker was in fallback {} s after the kill and shared again {} s after the restart",
                        seconds(first(killed, "fallback")),
                        seconds(first(restarted, "shared"))
                    );
                }
                notes.push(note);
            }
        }
        Event::WorkerCrash { .. } => {
            if let (Some(crash), Some(killed)) = (result.crash, result.mark(Mark::WorkerKilled)) {
                let mut note = format!(
                    "worker {} killed at {:.1} s holding {} jobs ({} lost)",
                    crash.pid,
                    at(killed),
                    crash.holding,
                    result.lost.len()
                );
                if let Some((permits, blocked)) = crash.permits {
                    let _ = write!(
                        note,
                        "; its {permits} permits kept capacity from the fleet for up to {blocked:.2} s (lease expiry)"
                    );
                }
                notes.push(note);
            }
        }
    }
    if let Some(announced) = scenario.announced {
        let served = served_per_window(&result.requests, 60_000_000);
        let allowed = u64::from(announced.budget_per_minute());
        // The last window is the run's tail (fewer jobs left than the budget): not counted.
        let full = &served[..served.len().saturating_sub(1)];
        let share = |n: u64| 100.0 * n as f64 / allowed as f64;
        let listed = full.iter().map(|n| format!("{n} ({:.1} %)", share(*n))).collect::<Vec<_>>().join(", ");
        let total: u64 = full.iter().sum();
        notes.push(format!(
            "served per full minute window (the budgets allow {allowed}): {}; in all {:.1} % of what the budgets \
             allow",
            if listed.is_empty() { "none (a run shorter than two windows)".to_string() } else { listed },
            if full.is_empty() { 0.0 } else { share(total) / full.len() as f64 }
        ));
    }
    if result.timed_out {
        notes.push("stopped at the run's deadline; unfinished jobs count as failures".into());
    }
    notes
}

/// Calls served (200) in each window of `window_us` from the first call's arrival, as the
/// provider counts its fixed windows.
pub(crate) fn served_per_window(requests: &[Request], window_us: u64) -> Vec<u64> {
    let Some(origin) = requests.iter().map(|r| r.start).min() else { return Vec::new() };
    let mut served = Vec::new();
    for r in requests.iter().filter(|r| r.status == 200) {
        let index = ((r.start - origin) / window_us) as usize;
        if served.len() <= index {
            served.resize(index + 1, 0);
        }
        served[index] += 1;
    }
    served
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn served_calls_are_counted_per_window_from_the_first_call() {
        let r = |start, status| Request { start, end: start + 1, status };
        let requests = [r(10, 200), r(20, 429), r(59, 200), r(70, 200), r(200, 200)];
        assert_eq!(served_per_window(&requests, 50), vec![2, 1, 0, 1]);
        assert!(served_per_window(&[], 50).is_empty());
    }

    #[test]
    fn a_row_follows_the_definitions() {
        let scenario = crate::scenario::SCENARIOS[0];
        let sizes = Sizes { jobs: 2, service_ms: (100, 100), ..Sizes::quick() };
        let mut result = RunResult::new("x", 1_000_000, 2);
        result.jobs[0] = Some(JobDone {
            id: 0,
            ok: true,
            attempts: 2,
            rate_limited: 1,
            start: 1_000_000,
            success_start: 1_500_000,
            end: 1_600_000,
        });
        result.jobs[1] = Some(JobDone { ok: false, id: 1, end: 3_000_000, ..result.jobs[0].expect("set") });
        result.requests = vec![
            Request { start: 1_000_000, end: 1_000_100, status: 429 },
            Request { start: 1_500_000, end: 1_600_000, status: 200 },
        ];
        let row = Row::new(&scenario, &sizes, &result);
        assert_eq!((row.jobs, row.succeeded, row.attempts, row.rate_limited), (2, 1, 2, 1));
        assert_eq!(row.success_pct(), 50.0);
        assert_eq!(row.share_429_pct(), 50.0);
        assert!((row.completion_s - 2.0).abs() < 1e-9);
        assert!((row.ideal_s - 0.2 / 8.0).abs() < 1e-9);
        assert_eq!(row.wait_p50_s, Some(0.5));
        assert_eq!(row.redis_per_permit, None);
        assert!(JobDone::parse("DONE id=1 ok=1 attempts=1 r429=0 start=1 success_start=2 end=3").is_some());
        assert!(table(&scenario, &sizes, &[result]).contains("| x | 50.0 % (1/2) | 2 | 50.0 %"));
    }
}
