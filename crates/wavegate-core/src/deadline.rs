//! Deadlines that refuse early: what a gate's state *proves* about the earliest a permit can
//! come, so a caller whose wait bound comes before it is told at once, with the time it would
//! have needed, instead of at its deadline.
//!
//! Only proofs count, never estimates. A [`Hold`] is a lower bound on the time until any grant
//! of a given estimate, from facts that nothing but an operator or a changed configuration
//! can undo before then:
//!
//! * **a cooldown** of the wave runs until its end;
//! * **the provider's window** (or a continuously refilled bucket) refuses every grant until
//!   it has room, and only an answer can end it sooner — so it proves something only while no
//!   call is in flight to answer;
//! * **the requests budget**: a request is never given back, so the GCRA's next room is a
//!   proof, taken against the loosest budget that may be in force before the bound (a learned
//!   limit may be forgotten, the configured one then applies);
//! * **the tokens budget**: a settlement may refund what running calls reserved, so the next
//!   room is a proof only with every token those calls reserved counted as refunded at once
//!   ([`Gcra::earliest_ms`]).
//!
//! Not proofs, so never a refusal: the limit (a release can come at any time), the priority
//! choice, the callers queued ahead (they may leave, and the earliest deadline goes first),
//! call durations. They feed the status's expected wait, which is an estimate.
//!
//! [`LocalGate::proven_hold`](crate::LocalGate::proven_hold) reads an in-process gate (local
//! mode, a fallback); [`HeardDenial`] is what a process keeps of the shared store's last
//! denial (shared mode: the fleet's state as last read).
//!
//! ```
//! use wavegate_core::{DenyReason, HeardDenial};
//!
//! // The store said at 1 000 ms: no room in the requests budget for 4 s.
//! let heard = HeardDenial { reason: DenyReason::RequestBudget, at_ms: 1_000, wait_ms: 4_000, tokens: 0, output: 0, in_flight: 3, learned: false };
//! let hold = heard.proves(2_000, 0, 0).expect("a request is never given back");
//! assert_eq!((hold.reason, hold.wait_ms), (DenyReason::RequestBudget, 3_000));
//! // The tokens budget with calls in flight: they may refund what they reserved.
//! let tokens = HeardDenial { reason: DenyReason::TokenBudget, tokens: 500, ..heard };
//! assert_eq!(tokens.proves(2_000, 500, 0), None);
//! ```

use crate::wave::DenyReason;

/// A proved lower bound on the time until a grant: none can come in the next `wait_ms`, for
/// `reason`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Hold {
    /// What holds the grants back: [`DenyReason::Cooldown`], [`DenyReason::ProviderWindow`],
    /// [`DenyReason::RequestBudget`] or [`DenyReason::TokenBudget`].
    pub reason: DenyReason,
    /// Milliseconds from now until a grant may come, at the earliest.
    pub wait_ms: u64,
}

impl Hold {
    /// A hold of `wait_ms` for `reason`; `None` for no wait.
    pub fn of(reason: DenyReason, wait_ms: u64) -> Option<Self> {
        (wait_ms > 0).then_some(Self { reason, wait_ms })
    }

    /// The later of two holds: every fact must allow a grant, so the latest bounds it.
    pub fn latest(a: Option<Self>, b: Option<Self>) -> Option<Self> {
        match (a, b) {
            (Some(a), Some(b)) => Some(if b.wait_ms > a.wait_ms { b } else { a }),
            (a, b) => a.or(b),
        }
    }
}

/// A gate's denial as a process heard it (shared mode: the store's reply to its last ask).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct HeardDenial {
    /// Why the ask was refused.
    pub reason: DenyReason,
    /// When the ask it answers was sent, in the process's clock milliseconds: the gate decided
    /// no earlier, so the wait counted from it never ends later than the gate's.
    pub at_ms: u64,
    /// The wait it gave for the ask it answered.
    pub wait_ms: u64,
    /// The token estimate of the ask it answered.
    pub tokens: u64,
    /// Of them, the output part (the input and output budgets).
    pub output: u64,
    /// The permits held when it was decided (the fleet's, in shared mode).
    pub in_flight: u32,
    /// Whether a limit learned from the provider may be in force: it may be forgotten before
    /// the bound, and the looser configured budget apply.
    pub learned: bool,
}

impl HeardDenial {
    /// What it proves at `now_ms` for an ask of `tokens`, `output` of them the answer's (see
    /// the module docs):
    /// * a cooldown, always;
    /// * the requests budget, unless a learned limit may be in force;
    /// * the tokens budget, unless a learned limit may be in force, only with no call in
    ///   flight (no refund can come) and for at least the tokens of the ask it answered, each
    ///   part (input, output) at least as large too (the wait grows with each);
    /// * the provider's window, only with no call in flight (no answer can end it) and for at
    ///   least the tokens of the ask it answered;
    /// * nothing else (another process's turn at the budgets' room ends when its waiter is
    ///   served, which may be sooner).
    pub fn proves(&self, now_ms: u64, tokens: u64, output: u64) -> Option<Hold> {
        let (output, heard_output) = (output.min(tokens), self.output.min(self.tokens));
        let parts = output >= heard_output && tokens - output >= self.tokens - heard_output;
        let quiet = self.in_flight == 0 && tokens >= self.tokens && parts;
        let holds = match self.reason {
            DenyReason::Cooldown => true,
            DenyReason::RequestBudget => !self.learned,
            DenyReason::TokenBudget => !self.learned && quiet,
            DenyReason::ProviderWindow => quiet,
            DenyReason::AtLimit | DenyReason::TokensExceedBurst | DenyReason::EarlierWaiter => false,
        };
        let end = self.at_ms.saturating_add(self.wait_ms);
        holds.then(|| Hold::of(self.reason, end.saturating_sub(now_ms))).flatten()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn heard(reason: DenyReason) -> HeardDenial {
        HeardDenial { reason, at_ms: 10_000, wait_ms: 5_000, tokens: 100, output: 0, in_flight: 0, learned: false }
    }

    #[test]
    fn each_reason_proves_only_what_nothing_can_undo() {
        let at = |h: HeardDenial, now, tokens| h.proves(now, tokens, 0).map(|hold| hold.wait_ms);
        for reason in [DenyReason::Cooldown, DenyReason::RequestBudget, DenyReason::TokenBudget] {
            assert_eq!(at(heard(reason), 11_000, 100), Some(4_000), "{reason:?}");
        }
        assert_eq!(at(heard(DenyReason::ProviderWindow), 11_000, 200), Some(4_000));
        // Over: nothing held.
        assert_eq!(at(heard(DenyReason::RequestBudget), 15_000, 100), None);
        // Never a proof: the limit (a release), a never-fitting estimate (its own error).
        assert_eq!(at(heard(DenyReason::AtLimit), 11_000, 100), None);
        assert_eq!(at(heard(DenyReason::TokensExceedBurst), 11_000, 100), None);
        // Calls in flight may refund tokens or answer with a shorter window; not requests.
        let busy = |reason| HeardDenial { in_flight: 1, ..heard(reason) };
        assert_eq!(at(busy(DenyReason::TokenBudget), 11_000, 100), None);
        assert_eq!(at(busy(DenyReason::ProviderWindow), 11_000, 100), None);
        assert_eq!(at(busy(DenyReason::RequestBudget), 11_000, 100), Some(4_000));
        assert_eq!(at(busy(DenyReason::Cooldown), 11_000, 100), Some(4_000));
        // A smaller estimate may fit sooner than the one refused.
        assert_eq!(at(heard(DenyReason::TokenBudget), 11_000, 99), None);
        assert_eq!(at(heard(DenyReason::ProviderWindow), 11_000, 99), None);
        // A learned limit may be forgotten: the budgets prove nothing then.
        let learned = |reason| HeardDenial { learned: true, ..heard(reason) };
        assert_eq!(at(learned(DenyReason::RequestBudget), 11_000, 100), None);
        assert_eq!(at(learned(DenyReason::TokenBudget), 11_000, 100), None);
        assert_eq!(at(learned(DenyReason::ProviderWindow), 11_000, 100), Some(4_000));
    }

    #[test]
    fn a_tokens_denial_proves_a_wait_only_for_asks_at_least_as_large_in_each_part() {
        // Refused an ask of 1,200 tokens, 200 of them output: either part's budget may be short.
        let heard = HeardDenial { tokens: 1_200, output: 200, ..heard(DenyReason::TokenBudget) };
        let at = |tokens, output| heard.proves(11_000, tokens, output).map(|hold| hold.wait_ms);
        assert_eq!(at(1_200, 200), Some(4_000));
        assert_eq!(at(1_500, 300), Some(4_000));
        // As many tokens but less output (the output budget may be the short one), or less
        // input (the input budget may be): no proof.
        assert_eq!(at(1_200, 0), None);
        assert_eq!(at(1_200, 1_000), None);
    }

    #[test]
    fn the_latest_hold_bounds_the_grant() {
        let a = Hold::of(DenyReason::Cooldown, 100);
        let b = Hold::of(DenyReason::TokenBudget, 300);
        assert_eq!(Hold::latest(a, b), b);
        assert_eq!(Hold::latest(b, a), b);
        assert_eq!(Hold::latest(None, a), a);
        assert_eq!(Hold::of(DenyReason::Cooldown, 0), None);
    }
}
