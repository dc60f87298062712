//! wavegate in a web app: actix-web (the default) or axum.
//!
//! * [`WebError`]: a scheduler error as a response — overloads become `503 Service
//!   Unavailable` with `Retry-After` and a small JSON body with a stable `code`;
//! * `/metrics` with [`install_prometheus`]: the Prometheus text;
//! * `/wavegate/status` ([`status`]): each upstream's mode, state, limit, wave, permits in
//!   flight, queue depth, breaker and cooldown;
//! * `/wavegate` ([`PAGE_HTML`]): a live status page, one self-contained HTML document (inline
//!   CSS, SVG charts drawn by an inline script, no front-end build, nothing fetched from
//!   elsewhere): a card per upstream with its limit, permits in flight, callers waiting, the
//!   longest wait and the 429s over the last five minutes and the timeline of its modes and
//!   states, redrawn every second, and the fleet's live processes in shared mode;
//! * `/wavegate/history` ([`history`]): what the page draws, as JSON — each upstream's samples
//!   (one a second, kept in process by the scheduler: `wavegate::history`; reading them sends
//!   nothing to Redis) and its changes of mode and state;
//! * for actix-web, [`configure`] mounts all four ([`metrics_handler`], [`status_handler`],
//!   [`page_handler`], [`history_handler`]) and `WebError` is a `ResponseError`;
//! * for axum, [`axum::router`] serves all four and `WebError` is an `IntoResponse`, with the
//!   same bodies.
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
#![cfg_attr(not(feature = "actix-web"), doc = "[`page_handler`]: #features")]
#![cfg_attr(not(feature = "actix-web"), doc = "[`history_handler`]: #features")]

#[cfg(feature = "actix-web")]
mod actix;
#[cfg(feature = "axum")]
pub mod axum;
mod error;
mod history;
mod prometheus;
mod status;

#[cfg(feature = "actix-web")]
pub use self::actix::{configure, history_handler, metrics_handler, page_handler, status_handler};
pub use error::{ErrorBody, WebError};
pub use history::{ChangeView, HistoryBody, PAGE_HTML, SeriesView, UpstreamHistoryView, history};
pub use prometheus::{InstallError, install_prometheus};
pub use status::{BudgetView, ClassView, RejectionView, ShadowView, StatusBody, StoreView, UpstreamView, status};

/// The path of the status endpoint.
pub const STATUS_PATH: &str = "/wavegate/status";
/// The path of the live status page ([`PAGE_HTML`]).
pub const PAGE_PATH: &str = "/wavegate";
/// The path of the history the status page draws ([`history`]): the page's own path and
/// `/history`, which the page finds wherever the app mounts it.
pub const HISTORY_PATH: &str = "/wavegate/history";
/// The path of the metrics endpoint.
pub const METRICS_PATH: &str = "/metrics";
