//! The turn at the budgets' next room: waiters of every process served in the order they were
//! refused.
//!
//! When the rate budgets or the provider's window refuse an ask, every process is told when
//! there will be room, and the first to ask then takes it. Without a turn, an ask that needs
//! much room (a large prompt) is passed at every refill by the small asks of other processes
//! that fit sooner, and waits far longer than in a fleet that serves in order (issue 23: the
//! p99 job latency at 1.6–1.8 × an oracle that serves each process's share in order).
//!
//! The rules (the spec tables check both twins, this and `lua/budget_turn.lua`):
//!
//! * an ask refused by a rate budget or the provider's window takes the turn when nobody holds
//!   it: its process holds it until the room it was told of; the holder refused again moves
//!   it; any other process refused joins the line (or moves the time it asks again);
//! * while another process holds the turn, an ask the budgets have room for is refused
//!   ([`DenyReason::EarlierWaiter`](crate::DenyReason::EarlierWaiter)) until the holder's time
//!   plus [`TURN_STEP_MS`] (at least that), and joins the line: the room is the holder's;
//! * the holder granted passes the turn to the first in line (at the later of now and the
//!   time that one asks again); a process granted without the turn leaves the line;
//! * a refusal for longer than [`TURN_HORIZON_MS`] takes no turn and no place in line (a
//!   holder told so gives the turn up): the turn does not outlive the waiter that took it by
//!   more than that (a caller may leave while its process holds the turn: nothing tells the
//!   store), and an ask needing a day's window does not hold back the asks that fit now; such
//!   long waits are served as before, by whoever asks first when the room comes;
//! * a holder not granted [`TURN_GRACE_MS`] past its time has given the turn up (it died, or
//!   its caller left): the turn passes on the same way, so one costs the others that much at
//!   most; the line keeps at most [`TURN_MOST`] processes (the others race for the room).
//!
//! An ask with no process name (a gate used without one) neither takes nor waits for a turn.
//! On an upstream with priority classes there is no turn: the fleet-wide choice of class
//! already decides whose waiter the room goes to.
//!
//! ```
//! use wavegate_core::BudgetTurn;
//!
//! let mut turn = BudgetTurn::default();
//! // Process a's ask is refused by the tokens budget: room in 300 ms; it takes the turn.
//! turn.refused("a", 1_000, 300);
//! // Process b's small ask fits at 1,200 ms, but the room is a's.
//! assert_eq!(turn.wait_ms("b", 1_200), Some(100 + 10));
//! // a is served at 1,300 ms and passes the turn to b, first in line.
//! turn.granted("a", 1_300);
//! assert_eq!(turn.wait_ms("b", 1_310), None);
//! assert_eq!(turn.wait_ms("a", 1_310), Some(10));
//! ```

use std::collections::VecDeque;

/// How long past its time a turn is still held (ms): a holder that is not granted by then has
/// given it up.
pub const TURN_GRACE_MS: u64 = 250;

/// How long after the holder's time another process asks again (ms), at least.
pub const TURN_STEP_MS: u64 = 10;

/// The longest wait a refusal may hold the turn for (ms): an ask told to wait longer takes
/// none (and a holder told so gives it up), so no turn outlives its waiter by more than this
/// and [`TURN_GRACE_MS`].
pub const TURN_HORIZON_MS: u64 = 2_000;

/// The most processes kept in line.
pub const TURN_MOST: usize = 64;

/// Who holds the turn at the budgets' next room, when that room comes, and who is in line;
/// see the module docs.
#[derive(Debug, Clone, PartialEq, Eq, Default, Hash)]
pub struct BudgetTurn {
    /// The process holding it and when it has room (clock ms); `None`: nobody.
    held: Option<(String, u64)>,
    /// The processes refused meanwhile, in order, with when each asks again.
    line: VecDeque<(String, u64)>,
}

impl BudgetTurn {
    /// Passes a holder stale at `now_ms` on (to the first in line, or nobody).
    fn settle(&mut self, now_ms: u64) {
        while let Some((_, at)) = &self.held {
            if at.saturating_add(TURN_GRACE_MS) > now_ms {
                break;
            }
            self.pass(now_ms);
        }
    }

    /// The turn goes to the first in line, at the later of now and when it asks again.
    fn pass(&mut self, now_ms: u64) {
        self.held = self.line.pop_front().map(|(next, at)| (next, at.max(now_ms)));
    }

    fn queue(&mut self, instance: &str, at: u64) {
        if let Some(entry) = self.line.iter_mut().find(|(name, _)| name == instance) {
            entry.1 = at;
        } else if self.line.len() < TURN_MOST {
            self.line.push_back((instance.to_owned(), at));
        }
    }

    fn leave(&mut self, instance: &str) {
        self.line.retain(|(name, _)| name != instance);
    }

    /// `instance` no longer waits: a turn it holds passes on, else it leaves the line.
    fn give_up(&mut self, instance: &str, now_ms: u64) {
        if self.held.as_ref().is_some_and(|(holder, _)| holder == instance) {
            self.pass(now_ms);
        } else {
            self.leave(instance);
        }
    }

    /// How long an ask of `instance` that the budgets have room for waits for another
    /// process's turn at `now_ms` (it joins the line); `None` when it may be granted.
    pub fn wait_ms(&mut self, instance: &str, now_ms: u64) -> Option<u64> {
        if instance.is_empty() {
            return None;
        }
        self.settle(now_ms);
        let (holder, at) = self.held.as_ref()?;
        if holder == instance {
            return None;
        }
        let wait = at.saturating_sub(now_ms) + TURN_STEP_MS;
        self.queue(instance, now_ms + wait);
        Some(wait)
    }

    /// An ask of `instance` was refused by a budget or the provider's window at `now_ms` for
    /// `wait_ms`: it takes the turn when nobody holds it (or keeps it, moved), else joins the
    /// line.
    pub fn refused(&mut self, instance: &str, now_ms: u64, wait_ms: u64) {
        if instance.is_empty() {
            return;
        }
        self.settle(now_ms);
        if wait_ms > TURN_HORIZON_MS {
            // A long wait is not held against the others: its waiter may leave long before.
            self.give_up(instance, now_ms);
            return;
        }
        let at = now_ms.saturating_add(wait_ms);
        match &self.held {
            Some((holder, _)) if holder != instance => self.queue(instance, at),
            _ => {
                self.leave(instance);
                self.held = Some((instance.to_owned(), at));
            }
        }
    }

    /// `instance` was granted at `now_ms`: a turn it held passes to the first in line; it
    /// leaves the line.
    pub fn granted(&mut self, instance: &str, now_ms: u64) {
        if instance.is_empty() {
            return;
        }
        self.settle(now_ms);
        self.give_up(instance, now_ms);
    }
}
