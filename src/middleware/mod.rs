//! Middleware that needs no closure at all: the HTTP client's requests go through the
//! scheduler.
//!
//! * `reqwest::WavegateMiddleware` (feature `reqwest-middleware`): a `reqwest-middleware`
//!   middleware; each request's upstream comes from an [`Upstream`](crate::Upstream) handle in
//!   its extensions or from its host. Requests whose body can be cloned get the whole policy
//!   (retries included); others one permit.
//! * `tower::WavegateLayer` (feature `tower`): a `tower::Layer` for hyper, tonic or axum
//!   clients; one permit per request, reported with the response's outcome (compose it with
//!   tower's own retry if you want retries, since a request body cannot be replayed in
//!   general); with `hold_bodies` (feature `http`) a
//!   streamed response body keeps the permit until its end;
//! * `HeldBody` (feature `http`): a response body holding its call's permit until it has
//!   been read to its end or dropped, for streamed answers (both middlewares use it).
//!
//! The actix-web glue stays in `wavegate-web`.

#[cfg(feature = "http")]
mod held_body;
#[cfg(feature = "reqwest-middleware")]
pub mod reqwest;
#[cfg(feature = "tower")]
pub mod tower;

#[cfg(feature = "http")]
pub use held_body::HeldBody;
