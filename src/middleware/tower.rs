//! A tower `Layer` (feature `tower`): every request through the wrapped service holds a
//! permit of one upstream while it runs, and its result is reported to the wave and the
//! breaker.
//!
//! Like tower's `ConcurrencyLimit`, the permit lives in the response future (no task per
//! request); unlike it, the limit is the upstream's (shared by the fleet through Redis), a 429
//! cuts it for everyone, and the wait is bounded (`max_wait`, then
//! [`ErrorKind::WaitedTooLong`](crate::ErrorKind::WaitedTooLong)). There is one attempt per request:
//! a request body cannot be replayed in general, so retries are left to tower's `Retry`
//! around this layer. The service's own error comes back untouched inside
//! an [`ErrorKind::Upstream`](crate::ErrorKind::Upstream) error ([`Error::source_error`]).
//!
//! The permit is released when the response arrives. For an HTTP service whose answers are
//! streamed (server-sent events from an LLM), `WavegateLayer::hold_bodies` (feature `http`)
//! keeps it until the response's body has been read to its end or dropped.
//!
//! ```
//! use std::convert::Infallible;
//! use std::future::{Ready, ready};
//! use std::task::{Context, Poll};
//!
//! use tower_layer::Layer;
//! use tower_service::Service;
//! use wavegate::middleware::tower::WavegateLayer;
//! use wavegate::{ByError, Scheduler, UpstreamConfig};
//!
//! /// Stands for a hyper or tonic client (with HTTP responses, classify with `ByStatus`).
//! #[derive(Clone)]
//! struct Provider;
//! impl Service<&'static str> for Provider {
//!     type Response = String;
//!     type Error = Infallible;
//!     type Future = Ready<Result<String, Infallible>>;
//!     fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
//!         Poll::Ready(Ok(()))
//!     }
//!     fn call(&mut self, prompt: &'static str) -> Self::Future {
//!         ready(Ok(format!("an answer to {prompt}")))
//!     }
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let scheduler = Scheduler::builder().upstream(UpstreamConfig::builder("llm").limit(4).build()?).build()?;
//! let mut service = WavegateLayer::new(scheduler.upstream("llm")?, ByError).layer(Provider);
//! std::future::poll_fn(|cx| service.poll_ready(cx)).await?;
//! assert_eq!(service.call("hello").await?, "an answer to hello");
//! # Ok(()) }
//! ```

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use tower_layer::Layer;
use tower_service::Service;

use crate::classify::Classify;
use crate::error::Error;
use crate::upstream::Upstream;

#[cfg(feature = "http")]
mod held;
#[cfg(feature = "http")]
pub use held::{HoldingLayer, HoldingService};

/// Wraps a service so that its requests go through `upstream`'s permits.
#[derive(Debug, Clone)]
pub struct WavegateLayer<C> {
    upstream: Upstream,
    classify: C,
}

impl<C> WavegateLayer<C> {
    /// Requests through the wrapped service take a permit of `upstream`; `classify` says what
    /// each result means ([`ByStatus`](crate::ByStatus) for HTTP responses).
    pub fn new(upstream: Upstream, classify: C) -> Self {
        Self { upstream, classify }
    }

    /// A layer for HTTP services (`http::Response<B>`) whose successful responses keep their
    /// permit while their body is still arriving — an event stream, or a body of unknown
    /// length — until the body is read to its end or dropped
    /// ([`HeldBody`](crate::middleware::HeldBody)); `meter` (cloned for each response) reads the
    /// usage the body reports (`SseUsage` with the feature `sse`, [`Reserved`](crate::Reserved)
    /// to keep the reservation). A body with a known length releases the permit when the
    /// response arrives.
    #[cfg(feature = "http")]
    pub fn hold_bodies<M>(self, meter: M) -> HoldingLayer<C, M> {
        HoldingLayer::new(self.upstream, self.classify, meter)
    }
}

impl<S, C: Clone> Layer<S> for WavegateLayer<C> {
    type Service = WavegateService<S, C>;

    fn layer(&self, inner: S) -> Self::Service {
        WavegateService { inner, upstream: self.upstream.clone(), classify: self.classify.clone() }
    }
}

/// A service whose requests each hold a permit of one upstream while they run.
#[derive(Debug, Clone)]
pub struct WavegateService<S, C> {
    inner: S,
    upstream: Upstream,
    classify: C,
}

impl<S, C, Request> Service<Request> for WavegateService<S, C>
where
    S: Service<Request> + Clone + Send + 'static,
    S::Future: Send,
    S::Response: Send,
    S::Error: Send,
    Request: Send + 'static,
    C: Classify<S::Response, S::Error> + Clone + Send + Sync + 'static,
{
    type Response = S::Response;
    type Error = Error<S::Error>;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, Error<S::Error>>> + Send>>;

    /// Always ready: the wait for a permit (and for the inner service) is in the response
    /// future, bounded by the upstream's `max_wait`.
    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request) -> Self::Future {
        // The clone that was (not) polled ready stays here; the future gets its own.
        let inner = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, inner);
        let (upstream, classify) = (self.upstream.clone(), self.classify.clone());
        Box::pin(async move {
            let mut permit = upstream.request().acquire().await.map_err(Error::widen)?;
            let result = match std::future::poll_fn(|cx| inner.poll_ready(cx)).await {
                Ok(()) => {
                    permit.request_sent();
                    inner.call(request).await
                }
                Err(error) => Err(error),
            };
            let outcome = classify.classify(&result);
            permit.report(outcome);
            result.map_err(|source| Error::upstream_failed(upstream.name(), outcome, 1, Some(source)))
        })
    }
}
