//! How an [`Error`] reads in `{:?}`: its kind, upstream and attempts, and what its kind knows.

use std::fmt;

use super::{Detail, Error};

/// The kind, the upstream, what the kind knows and the caller's error, if any.
impl<E: fmt::Debug> fmt::Debug for Error<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut debug = f.debug_struct("wavegate::Error");
        debug.field("kind", &self.inner.kind);
        if let Some(upstream) = &self.inner.upstream {
            debug.field("upstream", upstream);
        }
        if let Some(attempts) = self.inner.attempts {
            debug.field("attempts", &attempts);
        }
        match &self.inner.detail {
            Detail::None => {}
            Detail::UnknownUpstream(unknown) => {
                debug.field("known", &unknown.known);
            }
            Detail::QueueFull { capacity } => {
                debug.field("capacity", capacity);
            }
            Detail::WaitedTooLong { waited, retry_after, early } => {
                debug.field("waited", waited).field("retry_after", retry_after).field("refused_early", early);
            }
            Detail::BreakerOpen { retry_after } | Detail::QuotaExhausted { retry_after } => {
                debug.field("retry_after", retry_after);
            }
            Detail::RetryBudgetSpent { last } => {
                debug.field("last", last);
            }
            Detail::Upstream { outcome } => {
                debug.field("outcome", outcome);
            }
            Detail::InsufficientCapacity { budget, requested, burst } => {
                debug.field("budget", budget).field("requested", requested).field("burst", burst);
            }
            Detail::UnknownClass { class, known } => {
                debug.field("class", class).field("known", known);
            }
            Detail::Store { operation, message } => {
                debug.field("operation", operation).field("message", message);
            }
            Detail::InvalidSetting(error) => {
                debug.field("setting", error);
            }
            Detail::DeadlineHint { retry_after, early } => {
                debug.field("retry_after", retry_after).field("refused_early", early);
            }
        }
        if let Some(source) = &self.inner.source {
            debug.field("source", source);
        }
        debug.finish()
    }
}
