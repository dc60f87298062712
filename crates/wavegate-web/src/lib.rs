//! actix-web glue for wavegate.
//!
//! * [`WebError`]: a scheduler error as a response — overloads become `503 Service
//!   Unavailable` with `Retry-After` and a small JSON body with a stable `code`;
//! * [`metrics_handler`] (`/metrics`) with [`install_prometheus`]: the Prometheus text;
//! * [`status_handler`] (`/wavegate/status`): each upstream's mode, state, limit, wave, permits
//!   in flight, queue depth, breaker and cooldown;
//! * [`configure`]: mounts both;
//! * with the `axum` feature, `axum::router`: both for axum (the same bodies), and
//!   [`WebError`] as an axum response.
//!
//! # Features
//!
//! None is on by default; wavegate's own defaults are off too, so an app that does not ask for
//! Redis does not compile it.
//!
//! * `redis`: shared mode (wavegate's `redis` feature, `SchedulerBuilder::redis`) and the
//!   shared store in the status body (`store`). An app that turns on `wavegate/redis` itself
//!   gets shared mode but no `store` in the status (each upstream's `warning` then says to
//!   turn this one on).
//! * `axum`: `axum::router` (axum 0.8, routing only: the app brings its server).
//!
//! Embedding (`examples/embed.rs`, also in the README):
//!
//! ```no_run
#![doc = include_str!("../examples/embed.rs")]
//! ```

#[cfg(feature = "axum")]
pub mod axum;
mod error;
mod prometheus;
mod status;

pub use error::{ErrorBody, WebError};
pub use prometheus::{InstallError, install_prometheus, metrics_handler};
pub use status::{BudgetView, ClassView, RejectionView, StatusBody, StoreView, UpstreamView, status, status_handler};

use actix_web::web;

/// The path of the status endpoint.
pub const STATUS_PATH: &str = "/wavegate/status";
/// The path of the metrics endpoint.
pub const METRICS_PATH: &str = "/metrics";

/// Mounts `/metrics` and `/wavegate/status`. The app must hold `web::Data<Scheduler>`.
///
/// `/metrics` cannot be mounted without its recorder: `configure` installs the Prometheus
/// recorder ([`install_prometheus`], once per process) and hands its handle to the app. If
/// another `metrics` recorder is installed already, the app's own
/// `web::Data<PrometheusHandle>` is used, and without one `/metrics` answers 500 with a message
/// that says what to add. A missing scheduler is answered the same way on `/wavegate/status`.
pub fn configure(config: &mut web::ServiceConfig) {
    if let Ok(handle) = install_prometheus() {
        config.app_data(web::Data::new(handle));
    }
    config.route(METRICS_PATH, web::get().to(metrics_handler)).route(STATUS_PATH, web::get().to(status_handler));
}
