//! A `reqwest-middleware` middleware (feature `reqwest-middleware`): a `ClientWithMiddleware`
//! whose requests go through the scheduler.
//!
//! ```no_run
//! use reqwest_middleware::ClientBuilder;
//! use wavegate::middleware::reqwest::WavegateMiddleware;
//! use wavegate::{Scheduler, UpstreamConfig};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let scheduler = Scheduler::builder()
//!     .upstream(UpstreamConfig::builder("openai").limit(10).build()?)
//!     .upstream(UpstreamConfig::builder("images").limit(2).build()?)
//!     .build()?;
//! let client = ClientBuilder::new(reqwest::Client::new())
//!     .with(WavegateMiddleware::new().host("api.openai.com", scheduler.upstream("openai")?))
//!     .build();
//! // By host:
//! let reply = client.post("https://api.openai.com/v1/responses").send().await?;
//! // Or named on the request (an extension wins over the host):
//! let images = scheduler.upstream("images")?;
//! let picture = client.get("https://img.example/render").with_extension(images).send().await?;
//! # let _ = (reply, picture);
//! # Ok(()) }
//! ```
//!
//! A request whose upstream is neither in its extensions nor known by its host goes through
//! untouched. A request whose body can be cloned (`Request::try_clone`, any non-streaming
//! body) runs the whole policy, as [`RequestBuilder::call`](crate::RequestBuilder::call)
//! does: a 429 retried through a new permit (its `Retry-After` read from the response), a
//! transient failure with backoff inside the retry budget. A streaming body gets one permit
//! and one attempt, reported with its outcome. The last response comes back as it is (a 4xx
//! with its body); reqwest's own error comes back untouched; wavegate's refusals (waited too
//! long, breaker open, ...) come back as `reqwest_middleware::Error::Middleware` holding the
//! [`Error`].
//!
//! A successful response whose body is still arriving — an event stream
//! (`Content-Type: text/event-stream`) or a body of unknown length (chunked) — keeps its permit
//! until the body is read to its end or the response is dropped
//! ([`HeldBody`]): the provider's concurrency limit covers the
//! generation, not only its head. An event stream's final usage (OpenAI's `include_usage`
//! chunk, Anthropic's `message_start` and `message_delta`) settles the tokens budget. A body
//! with a `Content-Length` releases the permit when the response arrives, as before.

use ::reqwest::{Request, Response, ResponseBuilderExt};
use http::Extensions;
use reqwest_middleware::{Middleware, Next};
use tokio::time::Instant;
use wavegate_core::{Outcome, SseUsage};

use crate::classify::{ByStatus, Classify, UpstreamError};
use crate::error::Error;
use crate::held::Hold;
use crate::middleware::held_body::{HeldBody, is_event_stream, is_streamed};
use crate::upstream::Upstream;

/// The middleware: requests to known upstreams go through their scheduler.
#[derive(Debug, Clone, Default)]
pub struct WavegateMiddleware {
    hosts: Vec<(String, Upstream)>,
}

impl WavegateMiddleware {
    /// A middleware that knows no host yet: requests are routed by an [`Upstream`] in their
    /// extensions (`.with_extension(upstream)`) only.
    pub fn new() -> Self {
        Self::default()
    }

    /// Requests to `host` (as in the URL, e.g. `api.openai.com`) go through `upstream`.
    pub fn host(mut self, host: impl Into<String>, upstream: Upstream) -> Self {
        self.hosts.push((host.into(), upstream));
        self
    }

    fn route(&self, request: &Request, extensions: &Extensions) -> Option<Upstream> {
        if let Some(upstream) = extensions.get::<Upstream>() {
            return Some(upstream.clone());
        }
        let host = request.url().host_str()?;
        self.hosts.iter().find(|(known, _)| known.eq_ignore_ascii_case(host)).map(|(_, upstream)| upstream.clone())
    }
}

/// reqwest-middleware's error: reqwest's own as reqwest's, a middleware's as unexpected (not
/// retried, not a breaker failure).
impl UpstreamError for reqwest_middleware::Error {
    fn outcome(&self) -> Outcome {
        match self {
            reqwest_middleware::Error::Reqwest(error) => error.outcome(),
            reqwest_middleware::Error::Middleware(_) => Outcome::Unexpected { status: 0 },
        }
    }
}

fn into_middleware_error(error: Error<reqwest_middleware::Error>) -> reqwest_middleware::Error {
    error.split_source().unwrap_or_else(reqwest_middleware::Error::middleware)
}

#[async_trait::async_trait]
impl Middleware for WavegateMiddleware {
    async fn handle(
        &self,
        request: Request,
        extensions: &mut Extensions,
        next: Next<'_>,
    ) -> reqwest_middleware::Result<Response> {
        let Some(upstream) = self.route(&request, extensions) else {
            return next.run(request, extensions).await;
        };
        let Some(template) = request.try_clone() else {
            // A streaming body cannot be replayed: one permit, one attempt.
            let mut permit = upstream.request().acquire().await.map_err(reqwest_middleware::Error::middleware)?;
            let ends = Instant::now() + upstream.config().call_timeout();
            permit.request_sent();
            let result = next.run(request, extensions).await;
            let hold = Hold::of_attempt(permit, ByStatus.classify(&result), ends);
            return result.map(|response| held(response, hold));
        };
        let mut first = Some(request);
        let shared: &Extensions = extensions;
        let result = upstream
            .request()
            .classify(ByStatus)
            .call_kept(|_attempt| {
                let request = first.take().or_else(|| template.try_clone());
                let next = next.clone();
                let mut extensions = shared.clone();
                async move {
                    let Some(request) = request else {
                        return Err(reqwest_middleware::Error::middleware(std::io::Error::other(
                            "wavegate: the request could not be cloned for a retry",
                        )));
                    };
                    next.run(request, &mut extensions).await
                }
            })
            .await;
        let (response, kept) = result.map_err(into_middleware_error)?;
        Ok(held(response, Hold::new(upstream.name(), kept)))
    }
}

/// `response` with its body holding `hold`'s permit when the answer is still arriving (an event
/// stream, or a body of unknown length); otherwise the permit is released now.
fn held(response: Response, mut hold: Hold) -> Response {
    let event_stream = is_event_stream(response.headers());
    if !hold.is_held() || !is_streamed(response.headers(), response.content_length()) {
        hold.finish(None, None);
        return response;
    }
    let url = response.url().clone();
    let (mut parts, body) = http::Response::<::reqwest::Body>::from(response).into_parts();
    let meter = event_stream.then(SseUsage::new);
    let body = ::reqwest::Body::wrap(HeldBody::new(body, meter, hold));
    // Converting back to a reqwest response reads its URL from an extension only reqwest sets.
    if let Ok(with_url) = http::Response::builder().url(url).body(()) {
        parts.extensions.extend(with_url.into_parts().0.extensions);
    }
    Response::from(http::Response::from_parts(parts, body))
}
