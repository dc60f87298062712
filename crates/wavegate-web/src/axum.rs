//! The same endpoints for axum (feature `axum`): [`router`] serves `/metrics`,
//! `/wavegate/status`, the status page `/wavegate` and its `/wavegate/history`, and
//! [`WebError`] is an axum response too.
//!
//! The page, the status and history bodies and the error responses are the actix-web ones (the same JSON, status
//! codes and `Retry-After`), built by the same code. [`router`] installs the Prometheus
//! recorder as actix-web's `configure` does; an app that has its own Prometheus
//! recorder passes its handle to [`router_with_handle`] instead.
//!
//! The router can be merged into an app's router whatever its state, since it carries its own:
//!
//! ```no_run
//! use std::time::SystemTime;
//!
//! use axum::Router;
//! use axum::extract::State;
//! use axum::routing::post;
//! use wavegate::{Outcome, Scheduler, Upstream, UpstreamConfig};
//! use wavegate_web::WebError;
//!
//! async fn ask(State(llm): State<Upstream>) -> Result<String, WebError> {
//!     let answer = llm
//!         .request()
//!         .call(|_attempt| async {
//!             // Call the provider here; map its answer to Ok(..) or Err(Outcome::..).
//!             let (status, retry_after): (u16, Option<&str>) = (200, None);
//!             match status {
//!                 200..=299 => Ok("an answer".to_string()),
//!                 _ => Err(Outcome::from_status(status, retry_after, SystemTime::now())),
//!             }
//!         })
//!         .await?; // saturated → 503 + Retry-After + {"code": "waited_too_long", ...}
//!     Ok(answer)
//! }
//!
//! #[tokio::main]
//! async fn main() -> Result<(), Box<dyn std::error::Error>> {
//!     // Built once per process and cloned; its Upstream handle is the router's state.
//!     let scheduler = Scheduler::builder().upstream(UpstreamConfig::builder("llm").limit(10).build()?).build()?;
//!     let app = Router::new()
//!         .route("/ask", post(ask))
//!         .with_state(scheduler.upstream("llm")?)
//!         .merge(wavegate_web::axum::router(scheduler));
//!     let listener = tokio::net::TcpListener::bind("127.0.0.1:8080").await?;
//!     axum::serve(listener, app).await?;
//!     Ok(())
//! }
//! ```

use std::sync::Arc;

use ::axum::Router;
use ::axum::body::Body;
use ::axum::extract::State;
use ::axum::http::{HeaderValue, StatusCode, header};
use ::axum::response::{IntoResponse, Response};
use ::axum::routing::get;
use metrics_exporter_prometheus::PrometheusHandle;
use serde::Serialize;
use wavegate::Scheduler;

use crate::error::WebError;
use crate::history::PAGE_HTML;
use crate::prometheus::{CONTENT_TYPE, InstallError, install_prometheus, render};
use crate::{HISTORY_PATH, METRICS_PATH, PAGE_PATH, STATUS_PATH};

/// `/metrics`, `/wavegate/status`, `/wavegate` and `/wavegate/history` for `scheduler`, with
/// the Prometheus recorder installed
/// ([`install_prometheus`], once per process).
///
/// If another `metrics` recorder is installed already, `/metrics` answers 500 with a message
/// that says to pass that recorder's handle to [`router_with_handle`].
pub fn router<S>(scheduler: Scheduler) -> Router<S>
where
    S: Clone + Send + Sync + 'static,
{
    routes(Endpoints { scheduler, metrics: install_prometheus() })
}

/// `/metrics`, `/wavegate/status`, `/wavegate` and `/wavegate/history` for `scheduler`,
/// rendering the metrics of the Prometheus
/// recorder `handle` belongs to (the app's own).
pub fn router_with_handle<S>(scheduler: Scheduler, handle: PrometheusHandle) -> Router<S>
where
    S: Clone + Send + Sync + 'static,
{
    routes(Endpoints { scheduler, metrics: Ok(handle) })
}

/// What the endpoints read.
struct Endpoints {
    scheduler: Scheduler,
    metrics: Result<PrometheusHandle, InstallError>,
}

fn routes<S>(endpoints: Endpoints) -> Router<S>
where
    S: Clone + Send + Sync + 'static,
{
    Router::new()
        .route(METRICS_PATH, get(metrics))
        .route(STATUS_PATH, get(status))
        .route(PAGE_PATH, get(page))
        .route(HISTORY_PATH, get(history))
        .with_state(Arc::new(endpoints))
}

async fn metrics(State(endpoints): State<Arc<Endpoints>>) -> Response {
    match &endpoints.metrics {
        Ok(handle) => ([(header::CONTENT_TYPE, CONTENT_TYPE)], render(handle)).into_response(),
        Err(error) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
            format!(
                "wavegate: /metrics has no recorder to render: {error}. Pass the handle of the Prometheus \
                 recorder in use to wavegate_web::axum::router_with_handle\n"
            ),
        )
            .into_response(),
    }
}

async fn status(State(endpoints): State<Arc<Endpoints>>) -> Result<Response, WebError> {
    Ok(json(StatusCode::OK, &crate::status(&endpoints.scheduler).await?))
}

async fn page() -> Response {
    ([(header::CONTENT_TYPE, "text/html; charset=utf-8"), (header::CACHE_CONTROL, "no-store")], PAGE_HTML)
        .into_response()
}

async fn history(State(endpoints): State<Arc<Endpoints>>) -> Result<Response, WebError> {
    let mut response = json(StatusCode::OK, &crate::history(&endpoints.scheduler).await?);
    response.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    Ok(response)
}

/// `body` as a JSON response (what actix-web's `HttpResponse::json` answers).
fn json(status: StatusCode, body: &impl Serialize) -> Response {
    match serde_json::to_vec(body) {
        Ok(bytes) => (status, [(header::CONTENT_TYPE, "application/json")], Body::from(bytes)).into_response(),
        Err(error) => (StatusCode::INTERNAL_SERVER_ERROR, error.to_string()).into_response(),
    }
}

/// The response actix-web gives (see the [error table](crate::WebError)): the status, a
/// `Retry-After` for overloads and deadlines, the JSON [`ErrorBody`](crate::ErrorBody).
impl IntoResponse for WebError {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let mut response = json(status, &self.body());
        if let Some(seconds) = self.retry_after_seconds() {
            response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(seconds));
        }
        response
    }
}
