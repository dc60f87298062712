//! Redis Cluster: redis-rs's async cluster client, with wavegate's bounds.
//!
//! Every key of an upstream carries its hash tag, so each script touches one slot and runs on
//! the master that serves it; upstreams spread over the masters by their names. The client
//! follows `MOVED` and `ASK` itself (a few retries, short waits, all inside the command's own
//! timeout) and refreshes its slot map. Script loads and `PING` go to every node. The release
//! channels use plain `PUBLISH`, which a Cluster delivers to subscribers on every node, so the
//! listener subscribes on any one seed.

use crate::connection::{Connection, StoreConfig};
use crate::error::StoreError;

/// Redirects and reconnects the client may follow within one command.
#[cfg(feature = "cluster")]
const RETRIES: u32 = 3;

#[cfg(feature = "cluster")]
pub(crate) fn client(config: &StoreConfig) -> Result<redis::cluster::ClusterClient, StoreError> {
    redis::cluster::ClusterClientBuilder::new(config.cluster_nodes.iter().map(String::as_str))
        .connection_timeout(config.connect_timeout)
        .response_timeout(config.command_timeout)
        .retries(RETRIES)
        .min_retry_wait(5)
        .max_retry_wait(50)
        .build()
        .map_err(|source| StoreError::Refused { command: "connect", source })
}

#[cfg(not(feature = "cluster"))]
pub(crate) fn client(_: &StoreConfig) -> Result<(), StoreError> {
    Err(StoreError::invalid("a Redis Cluster needs wavegate's `cluster` feature"))
}

#[cfg(feature = "cluster")]
pub(crate) async fn connect(config: &StoreConfig, command: &'static str) -> Result<Connection, StoreError> {
    let timeout_ms = u64::try_from(config.connect_timeout.as_millis()).unwrap_or(u64::MAX);
    let connection = client(config)?
        .get_async_connection()
        .await
        .map_err(|error| StoreError::from_redis(command, timeout_ms, error))?;
    Ok(Connection::Cluster(connection))
}

#[cfg(not(feature = "cluster"))]
pub(crate) async fn connect(config: &StoreConfig, _: &'static str) -> Result<Connection, StoreError> {
    client(config)?;
    Err(StoreError::invalid("a Redis Cluster needs wavegate's `cluster` feature"))
}
