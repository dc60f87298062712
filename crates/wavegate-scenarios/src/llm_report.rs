//! The table of the scenarios on a provider with OpenAI's buckets (`openai-like…`) or
//! Anthropic's (`anthropic-like`), against issue 23's targets.
//!
//! Per strategy: **total** (the start signal to the last job's end) and its ratio to the
//! oracle's of the same round; **jobs failed** (no 200 in the end); **429s** as a share of the
//! calls the provider received (its own records), split into those of its buckets (a fleet that
//! overshoots them) and of its hidden cap, and the **500s** it answered; **job latency** p50 /
//! p99 (from the moment a caller took the job to its end, by nearest rank) and the p99's ratio
//! to the oracle's; the **most open at once** (calls served, streams open, as the provider
//! counted them); the **longest silence** (the longest time with no call sent while the
//! provider's buckets, as its last answer left them and refilled since, held the next call's
//! cost; the mock's own measure, [`wavegate_testkit::OpenAiBucket::longest_silence`],
//! [`wavegate_testkit::AnthropicBucket::longest_silence`]); **first 10 s**: the tokens of the
//! jobs sent in the first ten seconds (a fleet that uses the full starting bucket sends up to
//! its size there); **allowance used**: the tokens charged over what the provider allowed during
//! the run (its full bucket plus the refill over the total time; Anthropic: input and output
//! apart). Streamed answers add the streams whose settled tokens were the final usage (prompt +
//! completion) and the streams cut before their end; Anthropic's the **large calls** served and
//! not served, and the longest a served one took.

use std::fmt::Write as _;

use crate::report::RunResult;
use crate::scenario::{Bucket, Scenario};
use crate::stats::percentile;

/// What the provider's bucket reported at the end of a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BucketLog {
    /// The longest silence with room, in ms.
    pub(crate) silence_ms: u64,
    /// Tokens charged (Anthropic: input tokens).
    pub(crate) charged: u64,
    /// Anthropic: output tokens charged (adjusted to the output at each call's end).
    pub(crate) output_charged: Option<u64>,
    /// The most calls served (streams open) at once.
    pub(crate) max_open: Option<u64>,
    /// 429s for the hidden cap, and for the buckets.
    pub(crate) refused_cap: Option<u64>,
    pub(crate) refused_budget: Option<u64>,
    /// Streams whose client hung up before their end.
    pub(crate) cut: Option<u64>,
}

impl BucketLog {
    /// Reads the provider's `DUMPED … silence_ms=N charged=N …` line.
    pub(crate) fn parse(line: &str) -> Option<Self> {
        let num = |key| crate::protocol::num(line, key);
        Some(Self {
            silence_ms: num("silence_ms")?,
            charged: num("charged")?,
            output_charged: num("output_charged"),
            max_open: num("max_open"),
            refused_cap: num("refused_cap"),
            refused_budget: num("refused_budget"),
            cut: num("cut"),
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
    output_allowance_used: Option<f64>,
    /// Large calls served, and not served (refused or failed), and the longest a served one
    /// took from its caller taking it.
    large: (usize, usize, f64),
}

fn figures(bucket: &Bucket, result: &RunResult) -> Figures {
    let total_s = result.completion_s();
    let latency = |j: &crate::report::JobDone| j.end.saturating_sub(j.start) as f64 / 1e6;
    let mut latencies: Vec<f64> = result.jobs.iter().flatten().map(latency).collect();
    let first_10s_tokens = result
        .jobs
        .iter()
        .flatten()
        .filter(|j| j.ok && j.success_start.saturating_sub(result.t0) < 10_000_000)
        .map(|j| bucket.cost_of(j.id))
        .sum();
    let allowance = |per_minute: u32| f64::from(per_minute) * (1.0 + total_s / 60.0);
    let large_jobs: Vec<Option<&crate::report::JobDone>> = (0..result.jobs.len() as u64)
        .filter(|id| bucket.is_large(*id))
        .map(|id| result.jobs[id as usize].as_ref())
        .collect();
    let served: Vec<f64> = large_jobs.iter().flatten().filter(|j| j.ok).map(|j| latency(j)).collect();
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
        allowance_used: result.bucket.map(|b| b.charged as f64 / allowance(bucket.tpm)),
        output_allowance_used: result
            .bucket
            .and_then(|b| b.output_charged)
            .filter(|_| bucket.is_anthropic())
            .map(|c| c as f64 / allowance(bucket.otpm)),
        large: (served.len(), large_jobs.len() - served.len(), served.iter().copied().fold(0.0, f64::max)),
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
    let (stream, anthropic) = (bucket.stream, bucket.is_anthropic());
    let _ = write!(
        out,
        "| strategy | total | × oracle | jobs failed | 429s (% of calls): buckets / cap | 500s | job latency p50 / p99 \
         | p99 × oracle | most open at once | longest silence with room | first 10 s | {}allowance used |",
        if anthropic { "input " } else { "" }
    );
    if anthropic {
        let _ = write!(out, " output allowance used | large calls served / refused (longest) |");
    }
    if stream {
        let _ = write!(out, " streams settled from their usage / not | streams cut |");
    }
    let extra = usize::from(anthropic) * 2 + usize::from(stream) * 2;
    let _ = writeln!(out, "\n|---|{}", "---:|".repeat(11 + extra));
    for (row, result) in rows.iter().zip(results) {
        let log = result.bucket;
        let opt = |v: Option<u64>| v.map_or("-".to_string(), |v| v.to_string());
        let _ = write!(
            out,
            "| {} | {:.1} s | {} | {} | {} of {} ({:.1} %): {} / {} | {} | {:.1} / {:.1} s | {} | {} | {} | {}k tokens | {} |",
            row.strategy,
            row.total_s,
            ratio(row.total_s, oracle.map(|o| o.total_s)),
            row.failed,
            row.r429,
            row.calls,
            100.0 * row.r429 as f64 / row.calls.max(1) as f64,
            opt(log.and_then(|l| l.refused_budget)),
            opt(log.and_then(|l| l.refused_cap)),
            row.r500,
            row.p50_s,
            row.p99_s,
            ratio(row.p99_s, oracle.map(|o| o.p99_s)),
            opt(log.and_then(|l| l.max_open)),
            row.silence_s.map_or("-".into(), |s| format!("{s:.1} s")),
            row.first_10s_tokens / 1000,
            row.allowance_used.map_or("-".into(), |u| format!("{:.0} %", 100.0 * u)),
        );
        if anthropic {
            let (served, refused, longest) = row.large;
            let _ = write!(
                out,
                " {} | {served} / {refused} ({longest:.1} s) |",
                row.output_allowance_used.map_or("-".into(), |u| format!("{:.0} %", 100.0 * u)),
            );
        }
        if stream {
            let settled = if row.strategy.starts_with("wavegate") {
                format!("{} / {}", result.settled.0, result.settled.1)
            } else {
                "-".into()
            };
            let _ = write!(out, " {settled} | {} |", opt(log.and_then(|l| l.cut)));
        }
        let _ = writeln!(out);
    }
    let jobs = results.first().map_or(0, |r| r.jobs.len() as u64);
    let floor = bucket.admission_floor_s(jobs);
    if anthropic {
        let _ = writeln!(
            out,
            "\nprovider: {} requests/min, {} input and {} output tokens/min apart (buckets full at the start, \
             output charged max_tokens at admission and adjusted at the end); every {}th job {} in / {} out, the \
             others {}-{} in / up to {} out; floor of admission {floor:.1} s; fleet limit {}; target: a large call \
             served, not refused",
            bucket.rpm,
            bucket.tpm,
            bucket.otpm,
            bucket.large_every,
            crate::scenario::LARGE_PROMPT,
            crate::scenario::LARGE_OUTPUT,
            bucket.prompt.0,
            bucket.prompt.1,
            bucket.max_tokens,
            scenario.limit,
        );
        return out;
    }
    let _ = writeln!(
        out,
        "\nprovider: {} requests/min, {} tokens/min (buckets full at the start), hidden cap {}, {} ‰ 500s; jobs of \
         {}-{} prompt tokens + max_tokens {}{}; floor of admission {floor:.1} s; fleet limit {}; targets: total ≤ \
         1.15 × oracle, 0 failed, 429s ≤ 1 %, p99 ≤ 1.5 × oracle, no silence ≥ 1 s{}",
        bucket.rpm,
        bucket.tpm,
        bucket.cap,
        bucket.errors_per_mille,
        bucket.prompt.0,
        bucket.prompt.1,
        bucket.max_tokens,
        if stream { ", answers streamed over the service time" } else { "" },
        scenario.limit,
        if stream { "; streams held to their end: most open at once ≤ the limit, no 429 from the cap" } else { "" },
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bucket_line_is_read() {
        let line = "DUMPED n=512 silence_ms=1250 charged=1050000";
        let old = BucketLog {
            silence_ms: 1250,
            charged: 1_050_000,
            output_charged: None,
            max_open: None,
            refused_cap: None,
            refused_budget: None,
            cut: None,
        };
        assert_eq!(BucketLog::parse(line), Some(old));
        let line =
            "DUMPED n=9 silence_ms=0 charged=90 output_charged=40 max_open=7 refused_cap=0 refused_budget=3 cut=1";
        let new = BucketLog {
            silence_ms: 0,
            charged: 90,
            output_charged: Some(40),
            max_open: Some(7),
            refused_cap: Some(0),
            refused_budget: Some(3),
            cut: Some(1),
        };
        assert_eq!(BucketLog::parse(line), Some(new));
        assert_eq!(BucketLog::parse("DUMPED n=3"), None);
    }
}
