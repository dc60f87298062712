//! The permit of an answer that goes on after its call returned: a stream of chunks, a response
//! body still arriving. The permit stays held (its lease renewed by the lane's watchdog, like any
//! held permit) until the answer ends, fails, runs out of time or is dropped.
//!
//! [`HeldStream`](crate::HeldStream) and the middleware's bodies wrap their answer around one.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::time::Sleep;
use wavegate_core::{Outcome, TransportError};

use crate::call::{Held, Kept};
#[cfg(any(feature = "reqwest-middleware", all(feature = "tower", feature = "http")))]
use crate::engine::clock::Instant;
use crate::error::Error;
use crate::permit::Permit;

/// A streamed answer's permit and how it ends.
#[derive(Debug)]
pub(crate) struct Hold {
    /// `None` once reported (or when nothing was held: a final answer that was not a success).
    permit: Option<Permit>,
    /// The outcome of the answer's head, reported at the end.
    outcome: Outcome,
    upstream: String,
    attempts: u32,
    /// When the attempt's time is up: the stream is then cut, reported as a timeout.
    ends: Option<Pin<Box<Sleep>>>,
    /// The request's deadline, not the call timeout, sets `ends`: a cut there teaches nothing.
    by_deadline: bool,
}

impl Hold {
    /// Holds `kept`'s permit, if any, until the answer of `upstream` ends (none: a final answer
    /// that was not a success, whose permit was reported already).
    pub(crate) fn new(upstream: &str, kept: Kept) -> Self {
        let Kept { outcome, attempts, held } = kept;
        let (permit, ends, by_deadline) = match held {
            Some(Held { permit, ends, by_deadline }) => {
                (Some(permit), Some(Box::pin(tokio::time::sleep_until(ends))), by_deadline)
            }
            None => (None, None, false),
        };
        Self { permit, outcome, upstream: upstream.to_string(), attempts, ends, by_deadline }
    }

    /// Holds the `permit` of one attempt whose answer's head said `outcome` until the answer
    /// ends, or `ends`, if it is a success; any other outcome is reported at once.
    #[cfg(any(feature = "reqwest-middleware", all(feature = "tower", feature = "http")))]
    pub(crate) fn of_attempt(permit: Permit, outcome: Outcome, ends: Instant) -> Self {
        let upstream = permit.upstream().to_string();
        let held = if matches!(outcome, Outcome::Success { .. }) {
            Some(Held { permit, ends, by_deadline: false })
        } else {
            permit.report(outcome);
            None
        };
        Self::new(&upstream, Kept { outcome, attempts: 1, held })
    }

    /// Whether the permit is still held.
    pub(crate) fn is_held(&self) -> bool {
        self.permit.is_some()
    }

    /// The outcome of the answer's head.
    pub(crate) fn outcome(&self) -> Outcome {
        self.outcome
    }

    /// The permit held, if any.
    pub(crate) fn permit(&self) -> Option<&Permit> {
        self.permit.as_ref()
    }

    /// `Ready` with the error to give the caller once the attempt's time is up while the permit
    /// is held: past the call timeout, the permit is reported as a timeout (an
    /// [`Upstream`](crate::ErrorKind::Upstream) error); past the request's deadline, it is
    /// released with nothing learned ([`DeadlinePassed`](crate::ErrorKind::DeadlinePassed)),
    /// as `call` does.
    pub(crate) fn poll_expired<E>(&mut self, cx: &mut Context<'_>) -> Poll<Error<E>> {
        let (Some(ends), true) = (self.ends.as_mut(), self.permit.is_some()) else { return Poll::Pending };
        if ends.as_mut().poll(cx).is_pending() {
            return Poll::Pending;
        }
        self.ends = None;
        let Some(permit) = self.permit.take() else { return Poll::Pending };
        if self.by_deadline {
            permit.release_unfinished();
            return Poll::Ready(Error::deadline_passed(self.upstream.as_str(), self.attempts));
        }
        let outcome = Outcome::from_transport(TransportError::Timeout);
        permit.report(outcome);
        Poll::Ready(Error::upstream_failed(self.upstream.as_str(), outcome, self.attempts, None))
    }

    /// The answer ended: its head's outcome is reported, with `parts` (input, output) or
    /// else `tokens` as the usage when the stream said it (otherwise the reservation stands).
    pub(crate) fn finish(&mut self, tokens: Option<u64>, parts: Option<(u64, u64)>) {
        self.ends = None;
        if let Some(permit) = self.permit.take() {
            match (parts, tokens) {
                (Some((input, output)), _) => permit.report_usage_parts(self.outcome, input, output),
                (None, Some(tokens)) => permit.report_usage(self.outcome, tokens),
                (None, None) => permit.report(self.outcome),
            }
        }
    }

    /// What a cached input read weighs for the held permit's upstream, if set.
    pub(crate) fn cache_read_weight(&self) -> Option<f64> {
        self.permit.as_ref().and_then(Permit::cache_read_weight)
    }

    /// The answer failed midway with `outcome` (a reset, say); the caller's `source` comes back
    /// inside the error. Never retried: part of the answer was already given.
    pub(crate) fn fail<E>(&mut self, outcome: Outcome, source: E) -> Error<E> {
        self.ends = None;
        if let Some(permit) = self.permit.take() {
            permit.report(outcome);
        }
        Error::upstream_failed(self.upstream.as_str(), outcome, self.attempts, Some(source))
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        // Dropped before its end: the connection closes with it, so the permit goes back now.
        if let Some(permit) = self.permit.take() {
            permit.release_unfinished();
        }
    }
}
