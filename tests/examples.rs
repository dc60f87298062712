//! The examples run, as the guide (docs/guide.md) says they do (each with its feature: CI runs
//! `cargo test -p wavegate --features "reqwest-middleware tower" --test examples`).

#[cfg(feature = "reqwest")]
#[path = "../examples/plain_tokio.rs"]
mod plain_tokio;

#[path = "../examples/anthropic_budgets.rs"]
mod anthropic_budgets;

#[test]
fn anthropic_budgets_runs() {
    anthropic_budgets::main().expect("examples/anthropic_budgets.rs");
}

#[cfg(feature = "reqwest")]
#[path = "../examples/axum.rs"]
mod axum_service;

#[cfg(feature = "reqwest-middleware")]
#[path = "../examples/reqwest_middleware.rs"]
mod reqwest_middleware;

#[cfg(feature = "reqwest-middleware")]
#[path = "../examples/streaming.rs"]
mod streaming;

#[cfg(feature = "reqwest-middleware")]
#[test]
fn streaming_runs() {
    streaming::main().expect("examples/streaming.rs");
}

#[cfg(feature = "reqwest")]
#[test]
fn plain_tokio_runs() {
    plain_tokio::main().expect("examples/plain_tokio.rs");
}

#[cfg(feature = "reqwest-middleware")]
#[test]
fn reqwest_middleware_runs() {
    reqwest_middleware::main().expect("examples/reqwest_middleware.rs");
}

#[cfg(feature = "reqwest")]
#[test]
fn axum_runs() {
    axum_service::main().expect("examples/axum.rs");
}
