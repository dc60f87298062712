//! Shadow mode's fleet-wide record of the calls at the provider: when each went and ended,
//! and whether the provider served it, recorded as it ends, so that what a call met — a
//! success, or a 429 — counts the other processes' calls beside it (a process alone sees only
//! its own share of the fleet's). The Lua twin is `record_went`, `served_beside` and `met_at_once` in
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

/// How far after the record's now a span may end (ms): the processes of a fleet read their
/// own clocks, a little apart from the store's; a span said to end later is clamped to it.
pub const SERVED_SPANS_AHEAD_MS: u64 = 1_000;

/// How far a call's span, as its process timed it, may reach beyond its time at the provider
/// (ms, each side): a process times a call from its side of the connection (from sending the
/// request to reading the answer, a little wider than the provider's) and by its own clock
/// (the fleet's clocks a little apart). So a 429's span is widened by it (a call served beside
/// a refusal of under a millisecond must not be missed, or the 429 would be taken for the
/// limit's; one this close that was not there counts one more, and the 429 teaches nothing:
/// the next one does), and a success's count of the calls served beside it narrows every span
/// by it (two calls that followed each other at the provider must not be counted at once, or
/// a limit the provider never served would be taken for one that held).
pub const SPAN_MARGIN_MS: u64 = 5;

/// When a call went to the provider and when its answer ended, in milliseconds on the
/// record's clock: the in-process gate's own, or Unix time for the shared store (the clock
/// its `TIME` reads; each process converts its call's instants when it sends them, so a
/// span does not move with the time it takes to reach the store).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServedSpan {
    /// When the call went to the provider (ms).
    pub went_ms: u64,
    /// When the call's answer ended (ms; clamped to after `went_ms`).
    pub ended_ms: u64,
}

impl ServedSpan {
    /// The span that went `went_ago` and ended `ended_ago` before `now_ms`.
    pub fn ago(went_ago: Duration, ended_ago: Duration, now_ms: u64) -> Self {
        Self {
            went_ms: now_ms.saturating_sub(duration_ms(went_ago)),
            ended_ms: now_ms.saturating_sub(duration_ms(ended_ago)),
        }
    }

    /// The same instants on a clock that reads `to_now_ms` when this span's reads
    /// `from_now_ms` (a process's clock to the store's).
    pub fn moved(self, from_now_ms: u64, to_now_ms: u64) -> Self {
        let at = |ms: u64| {
            let moved = i128::from(to_now_ms) + i128::from(ms) - i128::from(from_now_ms);
            u64::try_from(moved.max(0)).unwrap_or(u64::MAX)
        };
        Self { went_ms: at(self.went_ms), ended_ms: at(self.ended_ms) }
    }

    /// Its start and end as the record at `now_ms` keeps it: went no earlier than the record
    /// keeps and no later than [`SERVED_SPANS_AHEAD_MS`] ahead; ended no later than that and
    /// after it went (a call quicker than a millisecond was there for its millisecond).
    fn at(self, now_ms: u64) -> (u64, u64) {
        let latest = now_ms.saturating_add(SERVED_SPANS_AHEAD_MS);
        let went = self.went_ms.clamp(now_ms.saturating_sub(SERVED_SPANS_KEEP_MS), latest);
        (went, self.ended_ms.min(latest).max(went + 1))
    }
}

/// The recent served calls of one upstream, fleet-wide (the in-process gate's: its members').
#[derive(Debug, Clone, Default)]
pub struct ServedSpans {
    /// `(ended, member, went, served)` in the sorted set's order: by end, then by member.
    spans: Vec<(u64, String, u64, bool)>,
}

impl ServedSpans {
    /// Records, at `now_ms`, that permit `id`'s call was at the provider over `span`,
    /// `served` or not (refused, failed). Recording it again changes nothing.
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
    /// `span` (read at `now_ms`) was there, each span narrowed by [`SPAN_MARGIN_MS`] at both
    /// ends: its own record counts it (at least 1).
    pub fn served_beside(&self, span: ServedSpan, now_ms: u64) -> u32 {
        let (went, ended) = narrowed(span.at(now_ms));
        let beside =
            self.ending_after(went, true, None).map(narrowed).filter(|&(start, end)| start < end && end > went);
        most_at_once(beside, went, ended)
    }

    /// The most calls a 429 met at the provider over `span` (read at `now_ms`): those at
    /// once while it was there, served or not (a provider counts the calls it is refusing
    /// too), and itself (its own record, if any, aside), within [`SPAN_MARGIN_MS`] of it.
    /// `None` when the record may have let calls beside it go: it holds
    /// [`SERVED_SPANS_MAX`] and the first of them ended after the 429 went (so many calls
    /// since that the ones that ended first were dropped, and a call dropped would make the
    /// 429 look within the limit).
    pub fn met(&self, id: &str, span: ServedSpan, now_ms: u64) -> Option<u32> {
        let (went, ended) = span.at(now_ms);
        let (went, ended) = (went.saturating_sub(SPAN_MARGIN_MS), ended + SPAN_MARGIN_MS);
        let full = self.spans.len() >= SERVED_SPANS_MAX;
        if full && self.spans.first().is_some_and(|&(first_end, _, _, _)| first_end > went) {
            return None;
        }
        let others = self.ending_after(went, false, Some(id));
        Some(most_at_once(others.chain([(went, ended)]), went, ended))
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

/// A span (start, end) narrowed by [`SPAN_MARGIN_MS`] at both ends (empty, start = end, when
/// shorter than twice that).
fn narrowed((start, end): (u64, u64)) -> (u64, u64) {
    let start = start + SPAN_MARGIN_MS;
    (start, end.saturating_sub(SPAN_MARGIN_MS).max(start))
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

    fn span(went_ms: u64, ended_ms: u64) -> ServedSpan {
        ServedSpan { went_ms, ended_ms }
    }

    #[test]
    fn a_call_counts_the_fleets_served_calls_beside_it() {
        let mut spans = ServedSpans::default();
        // Three calls of 100 ms or less, from three processes, recorded as each ended.
        spans.record("a", span(1_000, 1_100), true, 1_100);
        spans.record("b", span(1_020, 1_110), true, 1_110);
        spans.record("c", span(1_040, 1_120), true, 1_120);
        // Counted later (a ghost that waited reports late): the times are the call's.
        assert_eq!(spans.served_beside(span(1_040, 1_120), 1_220), 3, "a, b and c were served at 1,040–1,100");
        assert_eq!(spans.served_beside(span(1_000, 1_100), 1_100), 3, "a counted by its own record");
        // One that touches c's end: not beside it.
        spans.record("d", span(1_100, 1_150), true, 1_150);
        spans.record("e", span(1_120, 1_140), true, 1_140);
        assert_eq!(spans.served_beside(span(1_120, 1_140), 1_140), 2, "d and e; c ended as e went");
        // Two that followed each other at the provider, their spans (timed from their
        // processes' side) overlapping by less than the margin: not at once.
        spans.record("f", span(2_000, 2_103), true, 2_103);
        spans.record("g", span(2_100, 2_200), true, 2_200);
        assert_eq!(spans.served_beside(span(2_100, 2_200), 2_200), 1);
        assert_eq!(spans.served_beside(span(2_000, 2_103), 2_200), 1);
        // A 429 at once at 1,050: it met a, b and c.
        assert_eq!(spans.met("x", span(1_050, 1_050), 1_150), Some(4));
        // Another call refused at 1,050 (recorded, not served): the next 429 there met it too,
        // a success did not; the refusal's own record counts once.
        spans.record("y", span(1_050, 1_050), false, 1_150);
        assert_eq!(spans.met("x", span(1_050, 1_050), 1_150), Some(5));
        assert_eq!(spans.met("y", span(1_050, 1_050), 1_150), Some(4));
        assert_eq!(spans.served_beside(span(1_040, 1_120), 1_220), 3);
        // One after they all ended: alone.
        assert_eq!(spans.met("x", span(6_090, 6_090), 6_100), Some(1));
        assert_eq!(spans.served_beside(span(6_090, 6_090), 6_100), 1, "at least itself");
    }

    #[test]
    fn spans_are_kept_a_minute_and_at_most_so_many() {
        let mut spans = ServedSpans::default();
        spans.record("old", span(990, 1_000), true, 1_000);
        spans.record("new", span(1_000, 62_000), false, 62_000);
        assert_eq!(spans.spans.len(), 1, "the old one ended 61 s ago");
        for i in 0..SERVED_SPANS_MAX + 10 {
            let ended = 70_000 + i as u64;
            spans.record(&i.to_string(), span(ended - 1_000, ended), i % 2 == 0, ended);
        }
        assert_eq!(spans.spans.len(), SERVED_SPANS_MAX);
        // The first ten were dropped: a 429 beside them cannot be judged; one after the first
        // kept ended can.
        assert_eq!(spans.met("x", span(69_005, 69_005), 70_300), None, "calls beside it may be gone");
        // (From 70,015 with the margin: the 250 that ended after it, and itself.)
        assert_eq!(spans.met("x", span(70_020, 70_020), 70_300), Some(251));
        // A record made twice (a retried release) counts once.
        spans.record("x", span(79_999, 80_000), true, 80_000);
        spans.record("x", span(79_999, 80_000), true, 80_000);
        assert_eq!(spans.spans.len(), SERVED_SPANS_MAX);
    }

    #[test]
    fn absurd_spans_are_clamped() {
        let mut spans = ServedSpans::default();
        // Ended before it went: taken as instant.
        spans.record("a", span(5, 0), true, 10);
        assert_eq!(spans.spans[0].0, 6, "there for its millisecond");
        // Far in the future (a clock far ahead): at most a second ahead, where a is not.
        let ahead = span(u64::MAX, u64::MAX);
        assert_eq!(spans.met("b", ahead, 10), Some(1), "at 1,010, alone");
        spans.record("b", ahead, false, 10);
        assert_eq!(spans.spans[1].0, 1_011);
        // From the beginning of time to the end: from the oldest kept to a second ahead.
        assert_eq!(spans.met("c", span(0, u64::MAX), 10), Some(2), "a, then b, beside it");
    }

    #[test]
    fn a_span_moves_from_a_processs_clock_to_the_stores() {
        let span = ServedSpan::ago(Duration::from_millis(100), Duration::from_millis(20), 1_000);
        assert_eq!((span.went_ms, span.ended_ms), (900, 980));
        let moved = span.moved(1_000, 1_700_000_000_000);
        assert_eq!((moved.went_ms, moved.ended_ms), (1_699_999_999_900, 1_699_999_999_980));
        assert_eq!(moved.moved(1_700_000_000_000, 1_000), span, "and back");
        assert_eq!(span.moved(1_000, 50).went_ms, 0, "not before the clock began");
    }
}
