//! The layer for HTTP services whose answers are streamed (feature `http`): see
//! [`WavegateLayer::hold_bodies`](super::WavegateLayer::hold_bodies).

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use http_body::Body;
use tokio::time::Instant;
use tower_layer::Layer;
use tower_service::Service;

use crate::classify::Classify;
use crate::error::Error;
use crate::held::Hold;
use crate::middleware::held_body::{HeldBody, is_streamed};
use crate::stream::StreamMeter;
use crate::upstream::Upstream;

/// [`WavegateLayer::hold_bodies`](super::WavegateLayer::hold_bodies): requests hold a permit
/// until their response's body ends.
#[derive(Debug, Clone)]
pub struct HoldingLayer<C, M> {
    upstream: Upstream,
    classify: C,
    meter: M,
}

impl<C, M> HoldingLayer<C, M> {
    pub(crate) fn new(upstream: Upstream, classify: C, meter: M) -> Self {
        Self { upstream, classify, meter }
    }
}

impl<S, C: Clone, M: Clone> Layer<S> for HoldingLayer<C, M> {
    type Service = HoldingService<S, C, M>;

    fn layer(&self, inner: S) -> Self::Service {
        HoldingService {
            inner,
            upstream: self.upstream.clone(),
            classify: self.classify.clone(),
            meter: self.meter.clone(),
        }
    }
}

/// A service whose requests each hold a permit until their response's body ends.
#[derive(Debug, Clone)]
pub struct HoldingService<S, C, M> {
    inner: S,
    upstream: Upstream,
    classify: C,
    meter: M,
}

impl<S, C, M, Request, B> Service<Request> for HoldingService<S, C, M>
where
    S: Service<Request, Response = http::Response<B>> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: Send,
    B: Body + Send + 'static,
    Request: Send + 'static,
    C: Classify<http::Response<B>, S::Error> + Clone + Send + Sync + 'static,
    M: StreamMeter<B::Data> + Clone + Send + 'static,
{
    type Response = http::Response<HeldBody<B, M>>;
    type Error = Error<S::Error>;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    /// Always ready: the wait for a permit (and for the inner service) is in the response
    /// future, bounded by the upstream's `max_wait`.
    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request) -> Self::Future {
        // The clone that was (not) polled ready stays here; the future gets its own.
        let inner = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, inner);
        let (upstream, classify, meter) = (self.upstream.clone(), self.classify.clone(), self.meter.clone());
        Box::pin(async move {
            let mut permit = upstream.request().acquire().await.map_err(Error::widen)?;
            let ends = Instant::now() + upstream.config().call_timeout();
            let result = match std::future::poll_fn(|cx| inner.poll_ready(cx)).await {
                Ok(()) => {
                    permit.request_sent();
                    inner.call(request).await
                }
                Err(error) => Err(error),
            };
            let outcome = classify.classify(&result);
            match result {
                Ok(response) => {
                    let mut hold = Hold::of_attempt(permit, outcome, ends);
                    if !is_streamed(response.headers(), response.body().size_hint().exact()) {
                        hold.finish(None, None);
                    }
                    Ok(response.map(|body| HeldBody::new(body, meter, hold)))
                }
                Err(source) => {
                    permit.report(outcome);
                    Err(Error::upstream_failed(upstream.name(), outcome, 1, Some(source)))
                }
            }
        })
    }
}
