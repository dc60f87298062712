//! Shadow mode's fleet-wide record of the calls the provider served: when each success went
//! and ended, so that a success reported by one process counts the others' calls the provider
//! served beside it (a process alone sees only its own share of the fleet's). The Lua twin is
//! `served_at_once` in `lua/finish.lua`, on the key `<prefix>:{<upstream>}:served` (a sorted
//! set: member `<went ms>:<permit id>`, score the end in ms).
//!
//! A span is kept for [`SERVED_SPANS_KEEP_MS`] after its call ended, and at most
//! [`SERVED_SPANS_MAX`] of them (the ones that ended first go first): a success that ran
//! beside a span forgotten already counts fewer at once than the provider served, which
//! teaches the wave less, never more.

use std::time::Duration;

use crate::clock::duration_ms;

/// How long a served span is kept after its call ended (ms).
pub const SERVED_SPANS_KEEP_MS: u64 = 60_000;

/// The most served spans kept per upstream.
pub const SERVED_SPANS_MAX: usize = 256;

/// When a served call went and ended, as time before its report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServedSpan {
    /// How long before the report the call went to the provider.
    pub went_ago: Duration,
    /// How long before the report the call's answer ended (clamped to `went_ago`).
    pub ended_ago: Duration,
}

impl ServedSpan {
    /// Its start and end in the record's time at `now_ms`: went no earlier than the record
    /// keeps, ended no earlier than it went.
    fn at(self, now_ms: u64) -> (u64, u64) {
        let went_ago = duration_ms(self.went_ago).min(SERVED_SPANS_KEEP_MS);
        let ended_ago = duration_ms(self.ended_ago).min(went_ago);
        (now_ms.saturating_sub(went_ago), now_ms.saturating_sub(ended_ago))
    }
}

/// The recent served calls of one upstream, fleet-wide (the in-process gate's: its members').
#[derive(Debug, Clone, Default)]
pub struct ServedSpans {
    /// `(ended, member, went)` in the sorted set's order: by end, then by member.
    spans: Vec<(u64, String, u64)>,
}

impl ServedSpans {
    /// Records the success of permit `id` that ran over `span` (reported at `now_ms`), and
    /// returns the most calls the record shows served at once while it ran, itself included
    /// (at least 1).
    pub fn record(&mut self, id: &str, span: ServedSpan, now_ms: u64) -> u32 {
        let (went, ended) = span.at(now_ms);
        let member = format!("{went}:{id}");
        self.spans.retain(|(_, m, _)| *m != member);
        let oldest = now_ms.saturating_sub(SERVED_SPANS_KEEP_MS);
        self.spans.retain(|&(end, _, _)| end >= oldest);
        self.spans.push((ended, member, went));
        self.spans.sort();
        let over = self.spans.len().saturating_sub(SERVED_SPANS_MAX);
        self.spans.drain(..over);
        let beside = self.spans.iter().filter(|&&(end, _, _)| end > went).map(|&(end, _, start)| (start, end));
        most_at_once(beside, went, ended)
    }

    /// The most calls the record shows served at once while a call that was *not* served (a
    /// 429) was at the provider over `span` (reported at `now_ms`), itself included: what it
    /// met. A refusal quicker than a millisecond counts the calls served at its millisecond.
    pub fn met(&self, span: ServedSpan, now_ms: u64) -> u32 {
        let (went, ended) = span.at(now_ms);
        let ended = ended.max(went + 1);
        let beside = self.spans.iter().filter(|&&(end, _, _)| end > went).map(|&(end, _, start)| (start, end));
        most_at_once(beside.chain([(went, ended)]), went, ended)
    }
}

/// The most of `spans` (start, end) at once within `[went, ended]`; spans that touch do not
/// overlap. At least 1.
fn most_at_once(spans: impl Iterator<Item = (u64, u64)>, went: u64, ended: u64) -> u32 {
    let mut edges: Vec<(u64, i32)> = Vec::new();
    for (start, end) in spans {
        if start >= ended {
            continue;
        }
        edges.push((start.max(went), 1));
        if end < ended {
            edges.push((end, -1));
        }
    }
    edges.sort_unstable();
    let (mut at_once, mut most) = (0i32, 0i32);
    for (_, change) in edges {
        at_once += change;
        most = most.max(at_once);
    }
    u32::try_from(most).unwrap_or(0).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn span(went_ago: u64, ended_ago: u64) -> ServedSpan {
        ServedSpan { went_ago: Duration::from_millis(went_ago), ended_ago: Duration::from_millis(ended_ago) }
    }

    #[test]
    fn a_success_counts_the_fleets_served_calls_beside_it() {
        let mut spans = ServedSpans::default();
        // Three calls of 100 ms, from three processes, reported as each ended.
        assert_eq!(spans.record("a", span(100, 0), 1_100), 1);
        assert_eq!(spans.record("b", span(90, 0), 1_110), 2);
        assert_eq!(spans.record("c", span(80, 0), 1_120), 3, "a, b and c were served at 1,040–1,100");
        // One that went after the first ended: b and c only.
        assert_eq!(spans.record("d", span(50, 0), 1_150), 3);
        // One that touches c's end: not beside it.
        assert_eq!(spans.record("e", span(10, 0), 1_130), 2, "d and e; c ended as e went");
        // Reported late, as a ghost that waited does: the times are the call's, not the report's.
        assert_eq!(spans.record("f", span(1_100, 1_000), 6_100), 1);
    }

    #[test]
    fn a_refusal_counts_the_served_calls_it_met() {
        let mut spans = ServedSpans::default();
        for (id, went_ago) in [("a", 100), ("b", 90), ("c", 80)] {
            spans.record(id, span(went_ago, 0), 1_100);
        }
        // Refused at once at 1,050, reported at 1,150: it met a, b and c, and is not recorded.
        assert_eq!(spans.met(span(100, 100), 1_150), 4);
        assert_eq!(spans.met(span(100, 100), 1_150), 4);
        // Refused after a, b and c ended: alone.
        assert_eq!(spans.met(span(40, 30), 1_150), 1);
        assert_eq!(spans.spans.len(), 3);
    }

    #[test]
    fn spans_are_kept_a_minute_and_at_most_so_many() {
        let mut spans = ServedSpans::default();
        spans.record("old", span(10, 0), 1_000);
        assert_eq!(spans.record("new", span(61_000, 0), 62_000), 1, "the old one ended 61 s ago");
        assert_eq!(spans.spans.len(), 1);
        for i in 0..SERVED_SPANS_MAX + 10 {
            spans.record(&i.to_string(), span(1_000, 0), 70_000 + i as u64);
        }
        assert_eq!(spans.spans.len(), SERVED_SPANS_MAX);
        // A report made twice (a retried release) counts once.
        let again = spans.record("x", span(1, 0), 80_000);
        assert_eq!(spans.record("x", span(1, 0), 80_000), again);
        assert_eq!(spans.spans.len(), SERVED_SPANS_MAX);
    }

    #[test]
    fn absurd_spans_are_clamped() {
        let mut spans = ServedSpans::default();
        // Ended before it went, and went before the clock began: taken as instant, at 0.
        assert_eq!(spans.record("a", span(5, 50), 10), 1);
        assert_eq!(spans.record("b", ServedSpan { went_ago: Duration::MAX, ended_ago: Duration::MAX }, 10), 1);
    }
}
