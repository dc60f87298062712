//! Streamed answers: the permit is held until the stream ends, not until its head arrives.
//!
//! An LLM's streamed answer (server-sent events, chunks of a body) comes back from its call as
//! soon as its head does, and the generation goes on while the caller reads it. Releasing the
//! permit when the call returns would apply the concurrency limit and the tokens budget to the
//! heads, not to the generations. [`RequestBuilder::call_stream`](crate::RequestBuilder::call_stream)
//! runs the call with the whole policy (a 429 or a transient failure before the answer began is
//! retried as usual) and gives back a [`HeldStream`]: the stream, holding the permit —
//!
//! * to its end: the head's outcome is reported, and the tokens budget settled with the usage
//!   the stream reported at its end, when its [`StreamMeter`] found one (an OpenAI
//!   `include_usage` chunk, Anthropic's `message_start` and `message_delta`: `SseUsage`,
//!   feature `sse`), the reservation otherwise;
//! * to an error item: reported as that error says ([`UpstreamError`]: a reset is a transient
//!   failure for the breaker); the error comes back inside an [`Error`]. Never retried: part of
//!   the answer was given already;
//! * to the attempt's time: past the call timeout the stream yields a timeout error and the
//!   permit is reported as a timed-out call; past the request's deadline (when it comes
//!   first) it yields an [`ErrorKind::DeadlinePassed`](crate::ErrorKind::DeadlinePassed) error
//!   and the permit goes back with nothing learned, as `call` does;
//! * to its drop: the permit goes back at once, nothing learned and the reservation standing
//!   (dropping a streamed answer closes its connection, which is how a client stops a
//!   generation).
//!
//! Meanwhile the permit is held like any other: the lease watchdog renews it, so a stream longer
//! than the lease keeps its place under the limit.
//!
//! ```
//! use futures_util::StreamExt;
//! use wavegate::{Outcome, Scheduler, UpstreamConfig};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let scheduler = Scheduler::builder().upstream(UpstreamConfig::builder("llm").limit(1).build()?).build()?;
//! let llm = scheduler.upstream("llm")?;
//! let chunks = || futures_util::stream::iter(["Hel", "lo", "[usage 42]"].map(Ok::<_, Outcome>));
//! let mut answer = llm
//!     .request()
//!     .tokens(100)
//!     // Which item carries the final usage, and how many tokens it says.
//!     .meter(|chunk: &&str| chunk.strip_prefix("[usage ")?.strip_suffix(']')?.parse().ok())
//!     .call_stream(|_attempt| async move { Ok::<_, Outcome>(chunks()) }, |stream| stream)
//!     .await?;
//! assert_eq!(llm.status().await?.in_flight_local, 1); // held while it streams
//! while let Some(chunk) = answer.next().await {
//!     let _text = chunk?;
//! }
//! assert_eq!(llm.status().await?.in_flight_local, 0); // released at its end, 42 tokens used
//! # Ok(()) }
//! ```

use std::pin::Pin;
use std::task::{Context, Poll};

use futures_util::Stream;
use wavegate_core::Outcome;

use crate::classify::{Reserved, UpstreamError};
use crate::error::Error;
use crate::held::Hold;
use crate::permit::Permit;

/// Reads the tokens a streamed answer used from its items: "does this item carry the final
/// usage, and how many tokens does it say?".
///
/// Implemented for every `FnMut(&I) -> Option<u64>`, for [`Reserved`] (the reservation stands)
/// and, with the feature `sse`, for `SseUsage` over byte chunks (`AsRef<[u8]>`: `Bytes`,
/// `Vec<u8>`, `&str`, ...), which reads OpenAI's and Anthropic's server-sent events.
pub trait StreamMeter<I> {
    /// Looks at the next item; `Some(tokens)` when what the stream reported so far says the
    /// answer used `tokens` (the last such answer settles the budget).
    fn observe(&mut self, item: &I) -> Option<u64>;

    /// The stream ended: what the items seen say, if something was left unread (an event
    /// without its closing blank line).
    fn finish(&mut self) -> Option<u64> {
        None
    }

    /// The usage seen so far in its two parts, (input, output), when the stream said them
    /// apart (LLM providers do): the input and output tokens budgets are then settled each
    /// with its own. `None` by default: the total settles them, the input taken as reserved.
    fn parts(&self) -> Option<(u64, u64)> {
        None
    }

    /// [`parts`](Self::parts) with each cached input read weighing `cache_read_weight` of a
    /// token (the upstream's
    /// [`cache_read_weight`](crate::config::UpstreamConfigBuilder::cache_read_weight), when
    /// set). By default the same as `parts`: a meter that does not see cached reads.
    fn parts_weighted(&self, cache_read_weight: f64) -> Option<(u64, u64)> {
        let _ = cache_read_weight;
        self.parts()
    }
}

/// What `meter` says of the usage's parts, its cached reads weighed by `weight` when set.
pub(crate) fn meter_parts<I, M: StreamMeter<I> + ?Sized>(meter: &M, weight: Option<f64>) -> Option<(u64, u64)> {
    match weight {
        Some(weight) => meter.parts_weighted(weight),
        None => meter.parts(),
    }
}

impl<I, F> StreamMeter<I> for F
where
    F: FnMut(&I) -> Option<u64>,
{
    fn observe(&mut self, item: &I) -> Option<u64> {
        self(item)
    }
}

/// `None`: the reservation stands (a meter chosen by the answer, e.g. only for event streams).
impl<I, M: StreamMeter<I>> StreamMeter<I> for Option<M> {
    fn observe(&mut self, item: &I) -> Option<u64> {
        self.as_mut()?.observe(item)
    }

    fn finish(&mut self) -> Option<u64> {
        self.as_mut()?.finish()
    }

    fn parts(&self) -> Option<(u64, u64)> {
        self.as_ref()?.parts()
    }

    fn parts_weighted(&self, cache_read_weight: f64) -> Option<(u64, u64)> {
        self.as_ref()?.parts_weighted(cache_read_weight)
    }
}

impl<I> StreamMeter<I> for Reserved {
    fn observe(&mut self, _item: &I) -> Option<u64> {
        None
    }
}

#[cfg(feature = "sse")]
impl<I: AsRef<[u8]>> StreamMeter<I> for wavegate_core::SseUsage {
    fn observe(&mut self, item: &I) -> Option<u64> {
        self.feed(item.as_ref());
        self.usage().map(|usage| usage.tokens())
    }

    fn finish(&mut self) -> Option<u64> {
        wavegate_core::SseUsage::finish(self);
        self.usage().map(|usage| usage.tokens())
    }

    fn parts(&self) -> Option<(u64, u64)> {
        self.usage().map(|usage| (usage.input, usage.output))
    }

    fn parts_weighted(&self, cache_read_weight: f64) -> Option<(u64, u64)> {
        self.usage().map(|usage| (usage.input_counted(Some(cache_read_weight)), usage.output))
    }
}

/// A streamed answer holding its call's permit until it ends, fails, runs out of time or is
/// dropped; see the [module docs](crate::stream). Its items are the inner stream's, an error
/// inside an [`Error`] (kind [`Upstream`](crate::ErrorKind::Upstream), the stream's own error
/// in [`Error::source_error`]).
#[must_use = "a held stream keeps its permit until it is read to its end or dropped"]
pub struct HeldStream<S, M = Reserved> {
    inner: Pin<Box<S>>,
    meter: M,
    /// The latest usage the meter found.
    used: Option<u64>,
    hold: Hold,
    done: bool,
}

impl<S, M> std::fmt::Debug for HeldStream<S, M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HeldStream").field("hold", &self.hold).field("used", &self.used).finish_non_exhaustive()
    }
}

impl<S, M> HeldStream<S, M> {
    pub(crate) fn new(inner: S, meter: M, hold: Hold) -> Self {
        Self { inner: Box::pin(inner), meter, used: None, hold, done: false }
    }

    /// The outcome of the answer's head (a success, unless the call's last answer was a final
    /// failure that came back as a value, such as a 400 with its body: then nothing is held).
    pub fn outcome(&self) -> Outcome {
        self.hold.outcome()
    }

    /// Whether the stream still holds its permit.
    pub fn is_holding(&self) -> bool {
        self.hold.is_held()
    }

    /// The permit held, while it is.
    pub fn permit(&self) -> Option<&Permit> {
        self.hold.permit()
    }

    /// The tokens the stream reported using so far, if it did.
    pub fn tokens_used(&self) -> Option<u64> {
        self.used
    }
}

impl<S, M, I, E> Stream for HeldStream<S, M>
where
    S: Stream<Item = Result<I, E>>,
    E: UpstreamError,
    M: StreamMeter<I> + Unpin,
{
    type Item = Result<I, Error<E>>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        if this.done {
            return Poll::Ready(None);
        }
        if let Poll::Ready(timed_out) = this.hold.poll_expired(cx) {
            this.done = true;
            return Poll::Ready(Some(Err(timed_out)));
        }
        match this.inner.as_mut().poll_next(cx) {
            Poll::Ready(Some(Ok(item))) => {
                if let Some(tokens) = this.meter.observe(&item) {
                    this.used = Some(tokens);
                }
                Poll::Ready(Some(Ok(item)))
            }
            Poll::Ready(Some(Err(error))) => Poll::Ready(Some(Err(this.hold.fail(error.outcome(), error)))),
            Poll::Ready(None) => {
                if let Some(tokens) = this.meter.finish() {
                    this.used = Some(tokens);
                }
                let parts = meter_parts(&this.meter, this.hold.cache_read_weight());
                this.hold.finish(this.used, parts);
                this.done = true;
                Poll::Ready(None)
            }
            Poll::Pending => Poll::Pending,
        }
    }
}
