//! The shared store as the rest of the crate sees it.
//!
//! With the `redis` feature (on by default) these are `wavegate-redis`'s types. Without it,
//! [`Store`] and [`SharedGate`] are types with no values: an `Option` of them is always `None`,
//! so every shared-mode path is statically unreachable (the compiler drops it) and a
//! local-only build neither compiles nor links redis.

#[cfg(feature = "redis")]
pub(crate) use wavegate_redis::{SharedGate, Store, StoreConfig, StoreError};

#[cfg(not(feature = "redis"))]
pub(crate) use absent::{SharedGate, Store};

#[cfg(not(feature = "redis"))]
mod absent {
    /// No shared store in a build without the `redis` feature: there is no value of this type.
    #[derive(Debug, Clone)]
    pub(crate) enum Store {}

    /// No shared gate in a build without the `redis` feature: there is no value of this type.
    #[derive(Debug, Clone)]
    pub(crate) enum SharedGate {}
}

/// The shared gate of one upstream, bound to this process's instance id.
#[cfg(feature = "redis")]
pub(crate) fn shared_gate(store: &Store, config: &wavegate_core::UpstreamConfig, instance: &str) -> SharedGate {
    let gate = SharedGate::with_budgets(store.clone(), config.name(), config.wave(), config.budgets());
    let gate = if config.classes().is_empty() {
        gate
    } else {
        gate.with_classes(config.classes(), config.default_class(), config.class_count_window())
    };
    gate.for_instance(instance)
}

/// The shared gate of one upstream (unreachable: there is no store in this build).
#[cfg(not(feature = "redis"))]
pub(crate) fn shared_gate(store: &Store, _: &wavegate_core::UpstreamConfig, _: &str) -> SharedGate {
    match *store {}
}
