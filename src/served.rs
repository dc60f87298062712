//! Shadow mode's count of this process's calls at the provider, and of how many of them the
//! provider served at once: what a 429 or a success in shadow says about the limit
//! (`engine/lane/shadow.rs`). A call that met a 429 or a failure was at the provider, but not
//! served: it does not count towards another call's "served at once".

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use std::time::Duration;

use wavegate_core::SPAN_MARGIN_MS;

use crate::engine::clock::Instant;

/// This process's calls at the provider now, and the recent ones that it served.
#[derive(Debug, Default)]
pub(crate) struct CallsOut {
    next: u64,
    /// The calls at the provider, by number: when each went.
    open: HashMap<u64, Instant>,
    /// Calls served (they ended well), while a call still out may have overlapped them: when
    /// each went and ended, in the order they ended.
    served: VecDeque<(Instant, Instant)>,
}

/// One call at the provider, until it [`ends`](Self::end) or is dropped.
#[derive(Debug)]
pub(crate) struct CallOut {
    calls: Arc<Mutex<CallsOut>>,
    number: u64,
    went: Instant,
}

fn lock(calls: &Mutex<CallsOut>) -> MutexGuard<'_, CallsOut> {
    calls.lock().unwrap_or_else(PoisonError::into_inner)
}

impl CallsOut {
    /// A call goes to the provider now: the mark that counts it until it ends.
    pub(crate) fn go(calls: &Arc<Mutex<CallsOut>>) -> CallOut {
        let went = Instant::now();
        let mut out = lock(calls);
        let number = out.next;
        out.next += 1;
        out.open.insert(number, went);
        CallOut { calls: calls.clone(), number, went }
    }
}

impl CallOut {
    /// When the call went to the provider.
    pub(crate) fn went(&self) -> Instant {
        self.went
    }

    /// The request is sent now (the caller says so: `Permit::request_sent`): the call is at
    /// the provider from here, not from when it was let through.
    pub(crate) fn sent(&mut self) {
        self.went = Instant::now();
        if let Some(went) = lock(&self.calls).open.get_mut(&self.number) {
            *went = self.went;
        }
    }

    /// The call ended now, `served` (it succeeded) or not: the most of this process's calls
    /// the provider served at once while it was there, itself included (the calls still out
    /// count as served: a refusal comes back at once). A success counts with every span
    /// narrowed by [`SPAN_MARGIN_MS`] at both ends, as the fleet's record does
    /// ([`ServedSpans::served_beside`](wavegate_core::ServedSpans::served_beside)): calls
    /// timed from this side of the connection that followed each other at the provider are not
    /// counted at once.
    pub(crate) fn end(self, served: bool) -> usize {
        let now = Instant::now();
        let mut out = lock(&self.calls);
        out.open.remove(&self.number);
        let margin = if served { Duration::from_millis(SPAN_MARGIN_MS) } else { Duration::ZERO };
        let narrowed = |went: Instant, ended: Instant| (went + margin, ended.checked_sub(margin).unwrap_or(ended));
        let (went, until) = narrowed(self.went, now);
        // Edges inside this call's time: +1 where a served call starts, -1 where it ends.
        let mut edges: Vec<(Instant, i32)> = vec![(went, 1)];
        let others = out.served.iter().copied().chain(out.open.values().map(|&went| (went, now)));
        for (start, ended) in others {
            let (start, ended) = narrowed(start, ended);
            if ended > went && start < ended && start < until {
                edges.push((start.max(went), 1));
                if ended < until {
                    edges.push((ended, -1));
                }
            }
        }
        // At equal times an end comes before a start: calls that touch did not overlap.
        edges.sort_by_key(|&(at, change)| (at, change));
        let (mut at_once, mut most) = (0i32, 0i32);
        for (_, change) in edges {
            at_once += change;
            most = most.max(at_once);
        }
        if served {
            out.served.push_back((self.went, now));
        }
        // Forget what no call still out can have overlapped.
        let oldest = out.open.values().min().copied();
        while out.served.front().is_some_and(|&(_, ended)| oldest.is_none_or(|oldest| ended <= oldest)) {
            out.served.pop_front();
        }
        usize::try_from(most).unwrap_or(1).max(1)
    }
}

impl Drop for CallOut {
    fn drop(&mut self) {
        lock(&self.calls).open.remove(&self.number);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pause(ms: u64) {
        std::thread::sleep(Duration::from_millis(ms));
    }

    #[test]
    fn a_call_counts_those_served_beside_it_not_those_refused() {
        let calls = Arc::new(Mutex::new(CallsOut::default()));
        let first = CallsOut::go(&calls);
        let second = CallsOut::go(&calls);
        pause(20);
        let refused = CallsOut::go(&calls);
        // A refusal while two were served: three at the provider, two served and itself.
        assert_eq!(refused.end(false), 3);
        let third = CallsOut::go(&calls);
        pause(20);
        assert_eq!(first.end(true), 3, "first, second and third; the refused one is not counted");
        assert_eq!(second.end(true), 3);
        assert_eq!(third.end(true), 3);
        // Alone now: what ended before it went does not count.
        let alone = CallsOut::go(&calls);
        pause(20);
        assert_eq!(alone.end(true), 1);
        assert!(lock(&calls).served.is_empty() && lock(&calls).open.is_empty());
    }

    #[test]
    fn calls_that_touch_within_the_margin_were_not_served_at_once() {
        let calls = Arc::new(Mutex::new(CallsOut::default()));
        let before = CallsOut::go(&calls);
        pause(20);
        let mut after = CallsOut::go(&calls);
        pause(2);
        // Timed from this side, they overlap by 2 ms: at the provider, one after the other.
        assert_eq!(before.end(true), 1);
        pause(20);
        assert_eq!(after.end(true), 1);
        // Let through long before its request was sent: at the provider from the sending.
        let early = CallsOut::go(&calls);
        after = CallsOut::go(&calls);
        pause(20);
        let _ = early.end(true);
        after.sent();
        pause(20);
        assert_eq!(after.end(true), 1, "sent after the other ended");
    }
}
