//! wavegate in a web app: actix-web (the default) or axum.
//!
//! * [`WebError`]: a scheduler error as a response — overloads become `503 Service
//!   Unavailable` with `Retry-After` and a small JSON body with a stable `code`;
//! * `/metrics` with [`install_prometheus`]: the Prometheus text;
//! * `/wavegate/status` ([`status`]): each upstream's mode, state, limit, wave, permits in
//!   flight, queue depth, breaker and cooldown;
//! * for actix-web, [`configure`] mounts both ([`metrics_handler`], [`status_handler`]) and
//!   `WebError` is a `ResponseError`;
//! * for axum, [`axum::router`] serves both and `WebError` is an `IntoResponse`, with the same
//!   bodies.
//!
//! # Features
//!
//! wavegate's own defaults are off, so an app that does not ask for Redis does not compile it.
//!
//! * `actix-web` (on by default): [`configure`], the handlers, `WebError` as a
//!   `ResponseError`;
//! * `axum`: [`axum::router`] (axum 0.8 with no default features: routing only, the app
//!   brings its server). An axum app turns the default off:
//!   `wavegate-web = { default-features = false, features = ["axum"] }`;
//! * `redis`: shared mode (wavegate's `redis` feature, `SchedulerBuilder::redis`) and the
//!   shared store in the status body (`store`). An app that turns on `wavegate/redis` itself
//!   gets shared mode but no `store` in the status (each upstream's `warning` then says to
//!   turn this one on).
//!
//! Embedding in actix-web (`examples/embed.rs`, also in the README; for axum, see
//! [`axum::router`]):
//!
#![cfg_attr(feature = "actix-web", doc = "```no_run")]
#![cfg_attr(not(feature = "actix-web"), doc = "```ignore")]
#![doc = include_str!("../examples/embed.rs")]
//! ```
//!
// The items of a feature that is off link to the list of features.
#![cfg_attr(not(feature = "axum"), doc = "[`axum::router`]: #features")]
#![cfg_attr(not(feature = "actix-web"), doc = "[`configure`]: #features")]
#![cfg_attr(not(feature = "actix-web"), doc = "[`metrics_handler`]: #features")]
#![cfg_attr(not(feature = "actix-web"), doc = "[`status_handler`]: #features")]

#[cfg(feature = "actix-web")]
mod actix;
#[cfg(feature = "axum")]
pub mod axum;
mod error;
mod prometheus;
mod status;

#[cfg(feature = "actix-web")]
pub use self::actix::{configure, metrics_handler, status_handler};
pub use error::{ErrorBody, WebError};
pub use prometheus::{InstallError, install_prometheus};
pub use status::{BudgetView, ClassView, RejectionView, StatusBody, StoreView, UpstreamView, status};

/// The path of the status endpoint.
pub const STATUS_PATH: &str = "/wavegate/status";
/// The path of the metrics endpoint.
pub const METRICS_PATH: &str = "/metrics";
