//! Shadow mode's fleet-wide record of the calls at the provider: when each went and ended,
//! and whether the provider served it, recorded as it ends, so that what a call met — a
//! success, or a 429 — counts the other processes' calls beside it (a process alone sees only
//! its own share of the fleet's). The Lua twin is `record_served`, `served_beside` and `met_at_once` in
//! `lua/finish.lua`, on the key `<prefix>:{<upstream>}:served` (a sorted set: member
//! `<went ms>:<s|r>:<permit id>` (served or not), score the end in ms).
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

/// How close to a 429 a call counts as met (ms, each side): each process reports its calls'
/// times as so long before the report, which the store's clock places a round trip or a
/// queue's wait late, so records of different processes are a few milliseconds apart; a
/// call served beside a refusal of under a millisecond must not be missed for it (the 429
/// would be taken for the limit's). A call met this close that was not there counts one
/// more, and the 429 teaches nothing: the next one does.
pub const MET_MARGIN_MS: u64 = 5;

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
    /// keeps, ended no earlier than it went; a call quicker than a millisecond was there for
    /// its millisecond.
    fn at(self, now_ms: u64) -> (u64, u64) {
        let went_ago = duration_ms(self.went_ago).min(SERVED_SPANS_KEEP_MS);
        let ended_ago = duration_ms(self.ended_ago).min(went_ago);
        let went = now_ms.saturating_sub(went_ago);
        (went, now_ms.saturating_sub(ended_ago).max(went + 1))
    }
}

/// The recent served calls of one upstream, fleet-wide (the in-process gate's: its members').
#[derive(Debug, Clone, Default)]
pub struct ServedSpans {
    /// `(ended, member, went, served)` in the sorted set's order: by end, then by member.
    spans: Vec<(u64, String, u64, bool)>,
}

impl ServedSpans {
    /// Records that permit `id`'s call was at the provider over `span` (reported at
    /// `now_ms`, as the call ended), `served` or not (refused, failed). Recording it again
    /// changes nothing.
    pub fn record(&mut self, id: &str, span: ServedSpan, served: bool, now_ms: u64) {
        let (went, ended) = span.at(now_ms);
        let member = format!("{went}:{}:{id}", if served { 's' } else { 'r' });
        self.spans.retain(|(_, m, _, _)| *m != member);
        let oldest = now_ms.saturating_sub(SERVED_SPANS_KEEP_MS);
        self.spans.retain(|&(end, _, _, _)| end >= oldest);
        self.spans.push((ended, member, went, served));
        self.spans.sort();
        let over = self.spans.len().saturating_sub(SERVED_SPANS_MAX);
        self.spans.drain(..over);
    }

    /// The most calls the record shows served at once while a call the provider served over
    /// `span` (reported at `now_ms`) was there: its own record counts it (at least 1).
    pub fn served_beside(&self, span: ServedSpan, now_ms: u64) -> u32 {
        let (went, ended) = span.at(now_ms);
        most_at_once(self.ending_after(went, true, None), went, ended)
    }

    /// The most calls a 429 met at the provider over `span` (reported at `now_ms`): those at
    /// once while it was there, served or not (a provider counts the calls it is refusing
    /// too), and itself (its own record, if any, aside), within [`MET_MARGIN_MS`] of it.
    pub fn met(&self, id: &str, span: ServedSpan, now_ms: u64) -> u32 {
        let (went, ended) = span.at(now_ms);
        let (went, ended) = (went.saturating_sub(MET_MARGIN_MS), ended + MET_MARGIN_MS);
        let others = self.ending_after(went, false, Some(id));
        most_at_once(others.chain([(went, ended)]), went, ended)
    }

    /// The recorded spans (start, end) that ended after `went`: only the served ones if
    /// `served_only`, the one of permit `skip` aside.
    fn ending_after<'a>(
        &'a self,
        went: u64,
        served_only: bool,
        skip: Option<&'a str>,
    ) -> impl Iterator<Item = (u64, u64)> + 'a {
        self.spans
            .iter()
            .filter(move |&&(end, ref member, _, served)| {
                end > went && (served || !served_only) && skip.is_none_or(|skip| member_id(member) != skip)
            })
            .map(|&(end, _, start, _)| (start, end))
    }
}

/// The permit id of a member, `<went>:<s|r>:<id>`.
fn member_id(member: &str) -> &str {
    member.splitn(3, ':').nth(2).unwrap_or(member)
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
    fn a_call_counts_the_fleets_served_calls_beside_it() {
        let mut spans = ServedSpans::default();
        // Three calls of 100 ms, from three processes, recorded as each ended.
        spans.record("a", span(100, 0), true, 1_100);
        spans.record("b", span(90, 0), true, 1_110);
        spans.record("c", span(80, 0), true, 1_120);
        // Counted later (a ghost that waited reports late): the times are the call's.
        assert_eq!(spans.served_beside(span(180, 100), 1_220), 3, "a, b and c were served at 1,040–1,100");
        assert_eq!(spans.served_beside(span(100, 0), 1_100), 3, "a counted by its own record");
        // One that touches c's end: not beside it.
        spans.record("d", span(50, 0), true, 1_150);
        spans.record("e", span(10, 0), true, 1_130);
        assert_eq!(spans.served_beside(span(10, 0), 1_130), 2, "d and e; c ended as e went");
        // A 429 at once at 1,050: it met a, b and c.
        assert_eq!(spans.met("x", span(100, 100), 1_150), 4);
        // Another call refused at 1,050 (recorded, not served): the next 429 there met it too,
        // a success did not; the refusal's own record counts once.
        spans.record("y", span(100, 100), false, 1_150);
        assert_eq!(spans.met("x", span(100, 100), 1_150), 5);
        assert_eq!(spans.met("y", span(100, 100), 1_150), 4);
        assert_eq!(spans.served_beside(span(180, 100), 1_220), 3);
        // One after they all ended: alone.
        assert_eq!(spans.met("x", span(10, 10), 6_100), 1);
        assert_eq!(spans.served_beside(span(10, 10), 6_100), 1, "at least itself");
    }

    #[test]
    fn spans_are_kept_a_minute_and_at_most_so_many() {
        let mut spans = ServedSpans::default();
        spans.record("old", span(10, 0), true, 1_000);
        spans.record("new", span(61_000, 0), false, 62_000);
        assert_eq!(spans.spans.len(), 1, "the old one ended 61 s ago");
        for i in 0..SERVED_SPANS_MAX + 10 {
            spans.record(&i.to_string(), span(1_000, 0), i % 2 == 0, 70_000 + i as u64);
        }
        assert_eq!(spans.spans.len(), SERVED_SPANS_MAX);
        // A record made twice (a retried release) counts once.
        spans.record("x", span(1, 0), true, 80_000);
        spans.record("x", span(1, 0), true, 80_000);
        assert_eq!(spans.spans.len(), SERVED_SPANS_MAX);
    }

    #[test]
    fn absurd_spans_are_clamped() {
        let mut spans = ServedSpans::default();
        // Ended before it went, and went before the clock began: taken as instant, at 0.
        spans.record("a", span(5, 50), true, 10);
        let absurd = ServedSpan { went_ago: Duration::MAX, ended_ago: Duration::MAX };
        assert_eq!(spans.met("b", absurd, 10), 2, "at 0, with a (5 ms) within the margin");
        assert_eq!(spans.spans[0].0, 6, "there for its millisecond");
    }
}
