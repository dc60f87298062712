//! What the store last said is left of an upstream's day budgets, and which replies may say it.
//!
//! Each acquire's reply says what is left of the fleet's day (with a day budget). A fallback's
//! day shares start from the last word less this process's use since it, so a word must count
//! every use it is taken to count: a reply to a request the store ran before it heard of this
//! process's fallback grants (one that was on its way when the store stopped answering, and
//! comes back after) does not count them, and taking it as the word would forget them. While
//! the word is held, such replies say nothing; once the store heard the fallback's use (its
//! reconciliation answered), a reply says the day again if its request was sent after that.

use std::time::Instant;

use wavegate_core::DayLeft;

/// The last word on the day and which replies may replace it.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct DayWord {
    /// What the store said is left, and when its reply came (`None`: nothing yet).
    said: Option<(DayLeft, Instant)>,
    /// Which replies may say the day.
    heard_from: HeardFrom,
}

/// Which replies may replace the word.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
enum HeardFrom {
    /// Every reply.
    #[default]
    Any,
    /// None (a fallback runs: the store has not heard of its grants).
    None,
    /// Replies to requests sent at or after this instant (the store heard the fallback's use).
    SentSince(Instant),
}

impl DayWord {
    /// What the store last said is left of the day, and when.
    pub(crate) fn said(&self) -> Option<(DayLeft, Instant)> {
        self.said
    }

    /// A reply to a request sent at `sent` said `left` (now): it becomes the word, unless the
    /// word is held or the request went out before the store heard of the fallback's use.
    pub(crate) fn heard(&mut self, left: DayLeft, sent: Instant) {
        match self.heard_from {
            HeardFrom::None => return,
            HeardFrom::SentSince(since) if sent < since => return,
            HeardFrom::SentSince(_) | HeardFrom::Any => {}
        }
        self.said = Some((left, Instant::now()));
    }

    /// A fallback begins: later replies say nothing of the day until [`release`](Self::release).
    pub(crate) fn hold(&mut self) {
        self.heard_from = HeardFrom::None;
    }

    /// The store heard the fallback's use (or will never hear it): replies to requests sent
    /// from now on say the day again.
    pub(crate) fn release(&mut self) {
        if self.heard_from == HeardFrom::None {
            self.heard_from = HeardFrom::SentSince(Instant::now());
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn left(requests: u64) -> DayLeft {
        DayLeft { requests: Some(requests), tokens: None }
    }

    #[test]
    fn a_reply_sent_before_the_store_heard_the_fallback_says_nothing() {
        let mut word = DayWord::default();
        let before = Instant::now();
        word.heard(left(6), before);
        assert_eq!(word.said().map(|(l, _)| l), Some(left(6)));
        // The store stops answering; a reply on its way comes back during the fallback.
        word.hold();
        word.heard(left(4), before);
        word.heard(left(4), Instant::now());
        assert_eq!(word.said().map(|(l, _)| l), Some(left(6)));
        // Reconciled: a late reply of a request sent before says nothing, a new one says it.
        std::thread::sleep(Duration::from_millis(2));
        word.release();
        word.heard(left(3), before);
        assert_eq!(word.said().map(|(l, _)| l), Some(left(6)));
        word.heard(left(2), Instant::now());
        assert_eq!(word.said().map(|(l, _)| l), Some(left(2)));
    }
}
