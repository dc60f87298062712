//! This process's use of the day budgets since the store last said what is left of them: a
//! fallback starts its day shares from what was said, less this use
//! (`wavegate_core::LocalGate::fallback`, rule 4), so a day the fleet spent stays spent through
//! an outage and a flapping store hands out no fresh day.

use std::time::Instant;

use wavegate_core::{Budgets, ChargeStart};

/// Requests and tokens used here since the store's last word on the day (an acquire's reply,
/// granted or denied: `wavegate_redis::SharedGate::day_left`), however old, in shared mode and
/// in fallbacks: the grants the word does not count, and every settlement after it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct DayUsage {
    /// When the word they follow was heard (`None`: never).
    said_at: Option<Instant>,
    requests: u64,
    tokens: u64,
    /// The latest start the use can be charged from (the clock's ms of the uses).
    start: ChargeStart,
}

impl DayUsage {
    /// A grant of `tokens`. `word` is when the store last spoke, as the shared gate knows now
    /// (in any mode); `in_word` whether that word already counts this grant (a shared grant:
    /// its own reply said the day, after charging it). A newer word than the one followed so
    /// far counts all the use before it, so the count starts anew.
    /// `budgets` and `now_ms` (the lane's clock) place the use in time ([`ChargeStart`]).
    pub(super) fn granted(&mut self, word: Option<Instant>, in_word: bool, tokens: u64, budgets: Budgets, now_ms: u64) {
        self.follow(word);
        if !in_word {
            self.start.used(budgets, now_ms, (self.requests, self.tokens), (1, tokens));
            self.requests = self.requests.saturating_add(1);
            self.tokens = self.tokens.saturating_add(tokens);
        }
    }

    /// A settlement of `delta` tokens (the answer's usage less the reservation), made after the
    /// store's last word (`word`) in either mode: the store charged a shared one after it spoke,
    /// a fallback charged its own.
    pub(super) fn settled(&mut self, word: Option<Instant>, delta: i64, budgets: Budgets, now_ms: u64) {
        self.follow(word);
        // A refund leaves the latest start where it was (the TAT and the count drop alike).
        if delta > 0 {
            self.start.used(budgets, now_ms, (self.requests, self.tokens), (0, delta.unsigned_abs()));
        }
        self.tokens = self.tokens.saturating_add_signed(delta);
    }

    /// The requests and tokens used since the word heard at `said_at`, and the latest start
    /// they can be charged from: none if that word is newer than the last use (it counts it
    /// all).
    pub(super) fn since(&self, said_at: Instant) -> ((u64, u64), ChargeStart) {
        if self.said_at == Some(said_at) {
            ((self.requests, self.tokens), self.start)
        } else {
            ((0, 0), ChargeStart::default())
        }
    }

    fn follow(&mut self, word: Option<Instant>) {
        if let Some(at) = word
            && self.said_at != Some(at)
        {
            *self = Self { said_at: Some(at), requests: 0, tokens: 0, start: ChargeStart::default() };
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use wavegate_core::DayBudget;

    use super::*;

    fn day() -> Budgets {
        Budgets {
            requests_per_day: DayBudget::new(86_400, 10),
            tokens_per_day: DayBudget::new(864_000, 100),
            ..Budgets::default()
        }
    }

    #[test]
    fn counts_what_the_last_word_does_not_and_starts_anew_at_a_newer_one() {
        let first = Instant::now();
        let later = first + Duration::from_millis(5);
        let mut usage = DayUsage::default();
        let used = |usage: &DayUsage, at| usage.since(at).0;
        // A shared grant whose reply said the day: counted in that word.
        usage.granted(Some(first), true, 100, day(), 0);
        assert_eq!(used(&usage, first), (0, 0));
        // Its answer used 30 more than it reserved: the store charged them after it spoke.
        usage.settled(Some(first), 30, day(), 0);
        // Two grants in a fallback, which the store did not see.
        usage.granted(Some(first), false, 20, day(), 0);
        usage.granted(Some(first), false, 30, day(), 0);
        assert_eq!(used(&usage, first), (2, 80));
        // A denial said the day later: what came before is in it.
        assert_eq!(used(&usage, later), (0, 0));
        // The grants of a fallback after that denial's word are counted against it.
        usage.granted(Some(later), false, 1, day(), 0);
        usage.granted(Some(later), false, 2, day(), 0);
        usage.settled(Some(later), -1, day(), 0);
        assert_eq!(used(&usage, later), (2, 2));
        assert_eq!(used(&usage, first), (0, 0));
    }

    #[test]
    fn a_refund_never_makes_the_use_negative() {
        let at = Instant::now();
        let mut usage = DayUsage::default();
        usage.settled(Some(at), -500, day(), 0);
        assert_eq!(usage.since(at).0, (0, 0));
    }

    #[test]
    fn the_use_is_charged_from_the_latest_start_its_times_allow() {
        let word = Instant::now();
        let mut usage = DayUsage::default();
        // One a second (and 10 tokens a second): two at 20 s, after nothing, start at 20 s;
        // a third at 21 s, after two, could have started at 19 s: 20 s stays.
        usage.granted(Some(word), false, 10, day(), 20_000);
        usage.granted(Some(word), false, 10, day(), 20_000);
        usage.granted(Some(word), false, 10, day(), 21_000);
        assert_eq!(usage.since(word).1.at_ms(), Some(20_000));
        // 50 tokens more at 30 s, after 30: from 27 s.
        usage.settled(Some(word), 50, day(), 30_000);
        assert_eq!(usage.since(word).1.at_ms(), Some(27_000));
    }
}
