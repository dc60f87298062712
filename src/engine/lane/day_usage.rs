//! This process's grants since the store last said what is left of the day budgets: a fallback
//! starts its day shares from what was said, less these (`wavegate_core::LocalGate::fallback`,
//! rule 4), so a day the fleet spent stays spent through an outage and a flapping store hands
//! out no fresh day.

use std::time::Instant;

/// Requests and tokens granted here since the store's last word on the day (an acquire's reply,
/// `wavegate_redis::SharedGate::day_left`), however old, in shared mode and in fallbacks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct DayUsage {
    /// When the word they follow was heard (`None`: never).
    said_at: Option<Instant>,
    requests: u64,
    tokens: u64,
}

impl DayUsage {
    /// A grant of `tokens`; `said_at` is when the store last spoke (as the shared gate knows
    /// now; `None` outside shared mode: the last word stays). A newer word already counts the
    /// grants before it — the one that answered this grant too — so it starts the count anew.
    pub(super) fn granted(&mut self, said_at: Option<Instant>, tokens: u64) {
        match said_at {
            Some(at) if self.said_at != Some(at) => *self = Self { said_at: Some(at), requests: 0, tokens: 0 },
            _ => {
                self.requests = self.requests.saturating_add(1);
                self.tokens = self.tokens.saturating_add(tokens);
            }
        }
    }

    /// The requests and tokens granted since the word heard at `said_at`: none if that word is
    /// newer than the last grant's (it counts them all).
    pub(super) fn since(&self, said_at: Instant) -> (u64, u64) {
        if self.said_at == Some(said_at) { (self.requests, self.tokens) } else { (0, 0) }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn counts_the_grants_after_the_last_word_and_starts_anew_at_a_newer_one() {
        let first = Instant::now();
        let later = first + Duration::from_millis(5);
        let mut usage = DayUsage::default();
        // A shared grant whose reply said the day: counted in that word.
        usage.granted(Some(first), 100);
        assert_eq!(usage.since(first), (0, 0));
        // A grant whose reply was lost (no new word), then two in a fallback.
        usage.granted(Some(first), 10);
        usage.granted(None, 20);
        usage.granted(None, 30);
        assert_eq!(usage.since(first), (3, 60));
        // A denial said the day later, after all of them: none of them is after it.
        assert_eq!(usage.since(later), (0, 0));
        usage.granted(Some(later), 1);
        usage.granted(None, 2);
        assert_eq!(usage.since(later), (1, 2));
    }
}
