//! An axum service whose handler calls a rate-limited provider through wavegate: the
//! scheduler is built once, before the router, and its `Upstream` handle travels in the
//! router's state (it is cheap to clone). The handler borrows the state's `reqwest::Client`
//! in its closure and turns wavegate's errors into 503 / 504 / 502 with a `Retry-After`.
//!
//! It runs against the testkit's mock provider, which serves 4 calls at once and answers 429
//! beyond that, and sends 40 requests to its own service at once:
//!
//! ```sh
//! cargo run --example axum --features reqwest
//! ```
//!
//! (`tests/examples.rs` runs it too.)

use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use futures_util::future::join_all;
use wavegate::{ByStatus, Error, ErrorKind, Scheduler, Upstream, UpstreamConfig};
use wavegate_testkit::{MockUpstream, MockUpstreamConfig};

/// What every handler shares: the upstream's handle and one HTTP client.
#[derive(Clone)]
struct AppState {
    llm: Upstream,
    client: reqwest::Client,
    provider_url: String,
}

/// A wavegate error as the service's own answer.
struct ServiceError(Error<reqwest::Error>);

impl IntoResponse for ServiceError {
    fn into_response(self) -> Response {
        let status = match self.0.kind() {
            kind if kind.is_overload() => StatusCode::SERVICE_UNAVAILABLE,
            ErrorKind::DeadlinePassed => StatusCode::GATEWAY_TIMEOUT,
            ErrorKind::Upstream => StatusCode::BAD_GATEWAY,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        };
        let mut response = (status, format!("{}: {}\n", self.0.code(), self.0)).into_response();
        if let Some(wait) = self.0.retry_after() {
            let seconds = wait.as_secs_f64().ceil().max(1.0) as u64;
            response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(seconds));
        }
        response
    }
}

/// `GET /summary`: one provider call, through the fleet's permits.
async fn summary(State(state): State<AppState>) -> Result<String, ServiceError> {
    let reply = state
        .llm
        .request()
        .timeout(Duration::from_secs(20))
        .classify(ByStatus)
        .call(|_attempt| state.client.get(&state.provider_url).send())
        .await
        .map_err(ServiceError)?;
    Ok(format!("provider answered {}\n", reply.status()))
}

/// Runs the example; fails if a request did not end as described.
#[tokio::main]
pub(crate) async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let provider = MockUpstream::start(MockUpstreamConfig {
        capacity: Some(4),
        service_time: Duration::from_millis(20),
        retry_after: "0".to_string(),
        ..MockUpstreamConfig::default()
    })?;
    // Built once per process, outside any per-worker factory, and shared through the state.
    let scheduler = Scheduler::builder()
        .upstream(UpstreamConfig::builder("llm").limit(6).max_wait(Duration::from_secs(10)).build()?)
        .build()?;
    let state = AppState {
        llm: scheduler.upstream("llm")?,
        client: reqwest::Client::new(),
        provider_url: format!("http://{}/v1/complete", provider.addr()),
    };
    let app = Router::new().route("/summary", get(summary)).with_state(state);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(async move {
        axum::serve(listener, app).with_graceful_shutdown(async move { stopped.await.unwrap_or(()) }).await
    });

    let client = reqwest::Client::new();
    let url = format!("http://{addr}/summary");
    let requests = (0..40).map(|_| client.get(&url).send());
    let answered = join_all(requests).await.into_iter().filter(|r| r.as_ref().is_ok_and(|r| r.status() == 200));
    let answered = answered.count();
    let _ = stop.send(());
    server.await??;
    println!(
        "{answered}/40 requests to the axum service answered 200; the provider saw at most {} calls at once \
         (capacity 4, limit 6) and drew {} 429s, all retried through the wave",
        provider.max_in_flight(),
        provider.rate_limited()
    );
    if answered != 40 {
        return Err(format!("{} requests failed", 40 - answered).into());
    }
    if provider.max_in_flight() > 6 {
        return Err(format!("the provider saw {} calls at once, above the limit 6", provider.max_in_flight()).into());
    }
    Ok(())
}
