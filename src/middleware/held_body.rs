//! A response body that holds its call's permit until it has been read to its end or dropped
//! (feature `http`): the middleware's answer to a streamed response.
//!
//! The reqwest middleware and the tower layer's `hold_bodies` wrap a body whose answer is still
//! arriving (its length unknown: server-sent events, a chunked generation) in a [`HeldBody`]:
//! the permit is released with the response's outcome at the body's end, with the tokens its
//! [`StreamMeter`] read (for server-sent events, `SseUsage`, feature `sse`, reads OpenAI's and
//! Anthropic's final usage), or with the reservation when it read none. A body error is reported as a reset; a body that outlives its
//! call timeout is cut with a timeout error; a body dropped before its end gives the permit
//! back at once (see [`stream`](crate::stream)).

use std::pin::Pin;
use std::task::{Context, Poll};

use http_body::{Body, Frame, SizeHint};
use wavegate_core::{Outcome, TransportError};

use crate::classify::Reserved;
use crate::error::Error;
use crate::held::Hold;
use crate::stream::StreamMeter;

/// Whether a response's body is still arriving: an event stream (`Content-Type:
/// text/event-stream`), or a body whose length (`exact_len`) is unknown.
#[cfg(any(feature = "reqwest-middleware", all(feature = "tower", feature = "http")))]
pub(crate) fn is_streamed(headers: &http::HeaderMap, exact_len: Option<u64>) -> bool {
    exact_len.is_none() || is_event_stream(headers)
}

/// Whether a response's body is a stream of server-sent events.
#[cfg(any(feature = "reqwest-middleware", all(feature = "tower", feature = "http")))]
pub(crate) fn is_event_stream(headers: &http::HeaderMap) -> bool {
    headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .is_some_and(|value| value.trim_start().to_ascii_lowercase().starts_with("text/event-stream"))
}

/// A body holding its call's permit until its end or its drop; see the module docs. Its
/// errors are the inner body's inside an [`Error`] ([`Error::source_error`]), or a timeout.
#[must_use = "a held body keeps its permit until it is read to its end or dropped"]
pub struct HeldBody<B, M = Reserved> {
    inner: Pin<Box<B>>,
    meter: M,
    used: Option<u64>,
    hold: Hold,
    done: bool,
}

impl<B, M> std::fmt::Debug for HeldBody<B, M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HeldBody").field("hold", &self.hold).field("used", &self.used).finish_non_exhaustive()
    }
}

impl<B, M> HeldBody<B, M> {
    #[cfg(any(feature = "reqwest-middleware", all(feature = "tower", feature = "http")))]
    pub(crate) fn new(inner: B, meter: M, hold: Hold) -> Self {
        Self { inner: Box::pin(inner), meter, used: None, hold, done: false }
    }

    /// Whether the body still holds its permit.
    pub fn is_holding(&self) -> bool {
        self.hold.is_held()
    }

    /// The tokens the body reported using so far, if it did.
    pub fn tokens_used(&self) -> Option<u64> {
        self.used
    }
}

impl<B, M> Body for HeldBody<B, M>
where
    B: Body,
    M: StreamMeter<B::Data> + Unpin,
{
    type Data = B::Data;
    type Error = Error<B::Error>;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<B::Data>, Self::Error>>> {
        let this = &mut *self;
        if this.done {
            return Poll::Ready(None);
        }
        if let Poll::Ready(timed_out) = this.hold.poll_expired(cx) {
            this.done = true;
            return Poll::Ready(Some(Err(timed_out)));
        }
        match this.inner.as_mut().poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(tokens) = frame.data_ref().and_then(|data| this.meter.observe(data)) {
                    this.used = Some(tokens);
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(error))) => {
                // The answer broke off midway: a reset, whatever the body's error type.
                let outcome = Outcome::from_transport(TransportError::Reset);
                Poll::Ready(Some(Err(this.hold.fail(outcome, error))))
            }
            Poll::Ready(None) => {
                if let Some(tokens) = this.meter.finish() {
                    this.used = Some(tokens);
                }
                let parts = crate::stream::meter_parts(&this.meter, this.hold.cache_read_weight());
                this.hold.finish(this.used, parts);
                this.done = true;
                Poll::Ready(None)
            }
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        // Not before the end was read: the permit is released there.
        self.done
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
