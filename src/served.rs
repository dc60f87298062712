//! Shadow mode's count of this process's calls at the provider, and of how many of them the
//! provider served at once: what a 429 or a success in shadow says about the limit
//! (`engine/lane/shadow.rs`). A call that met a 429 or a failure was at the provider, but not
//! served: it does not count towards another call's "served at once".

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

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

    /// The call ended now, `served` (it succeeded) or not: the most of this process's calls
    /// the provider served at once while it was there, itself included (the calls still out
    /// count as served: a refusal comes back at once).
    pub(crate) fn end(self, served: bool) -> usize {
        let now = Instant::now();
        let mut out = lock(&self.calls);
        out.open.remove(&self.number);
        // Edges inside this call's time: +1 where a served call starts, -1 where it ends.
        let mut edges: Vec<(Instant, i32)> = vec![(self.went, 1)];
        let others = out.served.iter().copied().chain(out.open.values().map(|&went| (went, now)));
        for (went, ended) in others {
            if ended > self.went {
                edges.push((went.max(self.went), 1));
                if ended < now {
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

    #[test]
    fn a_call_counts_those_served_beside_it_not_those_refused() {
        let calls = Arc::new(Mutex::new(CallsOut::default()));
        let first = CallsOut::go(&calls);
        let second = CallsOut::go(&calls);
        let refused = CallsOut::go(&calls);
        // A refusal while two were served: three at the provider, two served and itself.
        assert_eq!(refused.end(false), 3);
        let third = CallsOut::go(&calls);
        assert_eq!(first.end(true), 3, "first, second and third; the refused one is not counted");
        assert_eq!(second.end(true), 3);
        assert_eq!(third.end(true), 3);
        // Alone now: what ended before it went does not count.
        let alone = CallsOut::go(&calls);
        assert_eq!(alone.end(true), 1);
        assert!(lock(&calls).served.is_empty() && lock(&calls).open.is_empty());
    }
}
