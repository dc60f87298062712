//! The table of the scenarios on a provider with OpenAI's buckets (`openai-like…`), against
//! issue 23's targets.
//!
//! Per strategy: **total** (the start signal to the last job's end) and its ratio to the
//! oracle's of the same round; **jobs failed** (no 200 in the end); **429s** as a share of the
//! calls the provider received (its own records) and the **500s** it answered; **job latency**
//! p50 / p99 (from the moment a caller took the job to its end, by nearest rank) and the p99's
//! ratio to the oracle's; the **longest silence** (the longest time with no call sent while the
//! provider's buckets, as its last answer's headers described them, held the next call's cost;
//! the mock's own measure, [`wavegate_testkit::OpenAiBucket::longest_silence`]); **first 10 s**:
//! the tokens of the jobs sent in the first ten seconds (a fleet that uses the full starting
//! bucket sends up to its size there); **allowance used**: the tokens charged over what the
//! provider allowed during the run (its full bucket plus the refill over the total time).

use std::fmt::Write as _;

use crate::report::RunResult;
use crate::scenario::{Bucket, Scenario};
use crate::stats::percentile;

/// What the provider's bucket reported at the end of a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BucketLog {
    /// The longest silence with room, in ms.
    pub(crate) silence_ms: u64,
    /// Tokens charged.
    pub(crate) charged: u64,
}

impl BucketLog {
    /// Reads the provider's `DUMPED … silence_ms=N charged=N` line.
    pub(crate) fn parse(line: &str) -> Option<Self> {
        Some(Self {
            silence_ms: crate::protocol::num(line, "silence_ms")?,
            charged: crate::protocol::num(line, "charged")?,
        })
    }
}

/// One strategy's figures.
#[derive(Debug, Clone, PartialEq)]
struct Figures {
    strategy: &'static str,
    total_s: f64,
    failed: usize,
    calls: usize,
    r429: usize,
    r500: usize,
    p50_s: f64,
    p99_s: f64,
    silence_s: Option<f64>,
    first_10s_tokens: u64,
    allowance_used: Option<f64>,
}

fn figures(bucket: &Bucket, result: &RunResult) -> Figures {
    let total_s = result.completion_s();
    let mut latencies: Vec<f64> =
        result.jobs.iter().flatten().map(|j| j.end.saturating_sub(j.start) as f64 / 1e6).collect();
    let first_10s_tokens = result
        .jobs
        .iter()
        .flatten()
        .filter(|j| j.ok && j.success_start.saturating_sub(result.t0) < 10_000_000)
        .map(|j| bucket.cost_of(j.id))
        .sum();
    let allowance = f64::from(bucket.tpm) * (1.0 + total_s / 60.0);
    Figures {
        strategy: result.strategy,
        total_s,
        failed: result.jobs.iter().filter(|j| !j.is_some_and(|j| j.ok)).count(),
        calls: result.requests.len(),
        r429: result.requests.iter().filter(|r| r.status == 429).count(),
        r500: result.requests.iter().filter(|r| r.status == 500).count(),
        p50_s: percentile(&mut latencies, 50.0).unwrap_or(0.0),
        p99_s: percentile(&mut latencies, 99.0).unwrap_or(0.0),
        silence_s: result.bucket.map(|b| b.silence_ms as f64 / 1000.0),
        first_10s_tokens,
        allowance_used: result.bucket.map(|b| b.charged as f64 / allowance),
    }
}

/// The table of one round (markdown), with the targets it is held to.
pub(crate) fn table(scenario: &Scenario, results: &[RunResult]) -> String {
    let mut out = String::new();
    let Some(bucket) = scenario.bucket else { return out };
    let rows: Vec<Figures> = results.iter().map(|r| figures(&bucket, r)).collect();
    let oracle = rows.iter().find(|r| r.strategy == "oracle");
    let ratio =
        |value: f64, of: Option<f64>| of.filter(|o| *o > 0.0).map_or("-".into(), |o| format!("{:.2}", value / o));
    let _ = writeln!(
        out,
        "| strategy | total | × oracle | jobs failed | 429s (% of calls) | 500s | job latency p50 / p99 | p99 × oracle \
         | longest silence with room | first 10 s | allowance used |"
    );
    let _ = writeln!(out, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for row in &rows {
        let _ = writeln!(
            out,
            "| {} | {:.1} s | {} | {} | {} of {} ({:.1} %) | {} | {:.1} / {:.1} s | {} | {} | {}k tokens | {} |",
            row.strategy,
            row.total_s,
            ratio(row.total_s, oracle.map(|o| o.total_s)),
            row.failed,
            row.r429,
            row.calls,
            100.0 * row.r429 as f64 / row.calls.max(1) as f64,
            row.r500,
            row.p50_s,
            row.p99_s,
            ratio(row.p99_s, oracle.map(|o| o.p99_s)),
            row.silence_s.map_or("-".into(), |s| format!("{s:.1} s")),
            row.first_10s_tokens / 1000,
            row.allowance_used.map_or("-".into(), |u| format!("{:.0} %", 100.0 * u)),
        );
    }
    let _ = writeln!(
        out,
        "\nprovider: {} requests/min, {} tokens/min (buckets full at the start), hidden cap {}, {} ‰ 500s; jobs of \
         {}-{} prompt tokens + max_tokens {}; floor of admission {:.1} s; targets: total ≤ 1.15 × oracle, 0 failed, \
         429s ≤ 1 %, p99 ≤ 1.5 × oracle, no silence ≥ 1 s",
        bucket.rpm,
        bucket.tpm,
        bucket.cap,
        bucket.errors_per_mille,
        bucket.prompt.0,
        bucket.prompt.1,
        bucket.max_tokens,
        bucket.admission_floor_s(results.first().map_or(0, |r| r.jobs.len() as u64)),
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bucket_line_is_read() {
        let line = "DUMPED n=512 silence_ms=1250 charged=1050000";
        assert_eq!(BucketLog::parse(line), Some(BucketLog { silence_ms: 1250, charged: 1_050_000 }));
        assert_eq!(BucketLog::parse("DUMPED n=3"), None);
    }
}
