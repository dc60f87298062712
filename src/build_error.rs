//! Why a scheduler could not be built.

#[cfg(feature = "redis")]
use crate::engine::store::StoreError;
use wavegate_core::{ConfigError, PoolConfigError};

/// Why a scheduler could not be built.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BuildError {
    /// The configuration cannot work; the message says what to change.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The Redis URL cannot be used.
    #[cfg(feature = "redis")]
    #[error("the Redis configuration cannot be used: {0}")]
    Store(#[from] StoreError),
    /// The Redis server answers but rejects wavegate: wrong credentials, an ACL user without
    /// the rights the scripts need, a server older than 6.2, an untrusted TLS certificate. The
    /// message says which ([`StoreError::rejection`]).
    #[cfg(feature = "redis")]
    #[error("Redis rejects wavegate: {0}")]
    Rejected(#[source] StoreError),
    /// A Redis URL was configured (in the settings) but this build of wavegate has no `redis`
    /// feature.
    #[error(
        "a Redis URL is configured ({url}) but wavegate was built without its `redis` feature: enable the feature \
         (it is on by default) or remove the URL to run in local mode"
    )]
    RedisNotBuilt {
        /// The configured URL.
        url: String,
    },
    /// A pool cannot work (no members, a member that is not an upstream, ...).
    #[error(transparent)]
    Pool(#[from] PoolConfigError),
    /// There was no actix system on this thread and the actors' own thread could not be
    /// started.
    #[error("cannot start wavegate's actor thread: {0}")]
    Runtime(#[source] std::io::Error),
}
