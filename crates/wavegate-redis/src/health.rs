//! What a [`Store`](crate::Store) knows about its server, for status pages and logs.
//!
//! Every command updates it: a rejection (wrong password, missing ACL rights) is recorded
//! with the server's words, and cleared by the next command that succeeds; the startup check
//! records the server's name and version; the configuration claims record the upstreams that
//! another process shares with a different configuration.

use std::collections::BTreeMap;

use crate::connection::StoreConfig;
use crate::error::Rejection;

/// The store's state as last seen: see [`Store::health`](crate::Store::health).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct StoreHealth {
    /// How the server is found: `single` or `sentinel`.
    pub topology: &'static str,
    /// The key prefix (namespace) of this scheduler's keys.
    pub key_prefix: String,
    /// The server's name and version, e.g. `redis 7.0.15`, once the startup check read them.
    pub server: Option<String>,
    /// Behind Sentinel: the primary in use (`host:port`), once one was named.
    pub primary: Option<String>,
    /// The server rejects this client now: why, and its words.
    pub rejected: Option<(Rejection, String)>,
    /// Upstreams another process stores with another configuration: name → its
    /// configuration, as the scripts receive it (`|`-separated).
    pub config_conflicts: BTreeMap<String, String>,
}

/// The mutable part, shared by a store's clones.
#[derive(Debug, Default)]
pub(crate) struct Health {
    pub(crate) server: Option<String>,
    pub(crate) primary: Option<String>,
    rejected: Option<(Rejection, String)>,
    pub(crate) config_conflicts: BTreeMap<String, String>,
}

impl Health {
    pub(crate) fn served(&mut self) {
        self.rejected = None;
    }

    pub(crate) fn rejected(&mut self, reason: Rejection, detail: &str) {
        self.rejected = Some((reason, detail.to_owned()));
    }

    pub(crate) fn snapshot(&self, config: &StoreConfig) -> StoreHealth {
        StoreHealth {
            topology: config.topology(),
            key_prefix: config.keyspace.prefix().to_owned(),
            server: self.server.clone(),
            primary: self.primary.clone(),
            rejected: self.rejected.clone(),
            config_conflicts: self.config_conflicts.clone(),
        }
    }
}
