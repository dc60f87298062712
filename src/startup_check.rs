//! The store's startup check, run by `build()`.
//!
//! `build()` is synchronous and may run inside an actix system or a tokio runtime, so the
//! check runs on a short-lived thread of its own, on a current-thread runtime, with a
//! connection of its own (every command bounded by the store's timeouts: one connect timeout
//! and a command timeout per command, a few per upstream). A rejection (wrong password,
//! missing ACL rights, a server older than 6.2) fails `build()`; an outage does not (the
//! scheduler starts in shared mode and fails open at its first call, as it would have); any
//! other refusal is logged and left to the calls.

use wavegate_core::{Instance, UpstreamConfig};
use wavegate_redis::{SharedGate, Store, StoreError};

use crate::build_error::BuildError;
use crate::engine::HEARTBEAT_TTL;

/// Runs [`Store::check`] for `upstreams` and the process `instance`, and decides what
/// `build()` does with its answer: the live processes its heartbeat counted, if it answered.
pub(crate) fn check_store(
    store: &Store,
    upstreams: &[UpstreamConfig],
    instance: &Instance,
) -> Result<Option<u32>, BuildError> {
    let check = store.with_own_connection()?;
    // The gates as the engine builds them, so the configuration claimed here is the one the
    // engine claims later (with the classes).
    let gates: Vec<SharedGate> = upstreams.iter().map(|u| SharedGate::for_upstream(check.clone(), u)).collect();
    let instance = instance.to_string();
    let run = move || -> std::io::Result<Result<_, StoreError>> {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        Ok(runtime.block_on(check.check(&gates, &instance, HEARTBEAT_TTL)))
    };
    let result = std::thread::Builder::new()
        .name("wavegate-store-check".into())
        .spawn(run)
        .map_err(BuildError::Runtime)?
        .join()
        .unwrap_or_else(|_| Err(std::io::Error::other("the store check's thread panicked")))
        .map_err(BuildError::Runtime)?;
    match result {
        Ok(info) => {
            tracing::info!(server = %info.name, version = %info.version, prefix = store.config().keyspace.prefix(), topology = store.config().topology(), "shared store checked");
            for warning in &info.warnings {
                tracing::warn!(%warning, "the shared store allows less than wavegate uses; see docs/redis.md");
            }
            for (upstream, theirs) in store.health().config_conflicts {
                tracing::error!(%upstream, theirs = %theirs, "another process shares this upstream's keys with another configuration; give each application its own key prefix");
            }
            Ok(Some(info.live))
        }
        Err(error) if error.is_rejection() => Err(BuildError::Rejected(error)),
        Err(error) if error.is_outage() => {
            tracing::warn!(%error, "shared store unreachable at start; the first calls will fail open");
            Ok(None)
        }
        Err(error) => {
            tracing::error!(%error, "the shared store's startup check failed");
            Ok(None)
        }
    }
}
