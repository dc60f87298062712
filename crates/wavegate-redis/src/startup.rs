//! The checks before sharing: is this a server wavegate can use, with these credentials?
//!
//! [`Store::check`] asks the server's version (`HELLO`: Redis 6.2 or newer, since the scripts
//! use `ZADD GT`; Valkey reports its own), loads the scripts (`SCRIPT LOAD`), runs the
//! heartbeat script for the process (so it knows how many processes share the limits before
//! its first permit), runs every path of the scripts once on scratch keys (priority classes,
//! tenants, rate budgets, the provider's windows, wake-ups, adoption: see `check_paths.rs`),
//! and for each
//! upstream runs the reconcile script with nothing to adopt or drop (what every acquire
//! does first: purge expired leases, apply time, save the state), publishes on its release
//! channel and claims its configuration. So a wrong password, an ACL user missing a command or
//! a key pattern, or a server too old fails here with a
//! [`StoreError::Rejected`] that says which, instead of showing up later as an outage that
//! never ends. Missing channel rights are only a warning ([`ServerInfo::warnings`]): the
//! scripts publish with `pcall` and waiters poll as well. An outage during the check is only
//! an outage (the scheduler fails open).

use std::time::Duration;

use redis::Value;
use wavegate_core::OutageUsage;

use crate::connection::Store;
use crate::error::{Rejection, StoreError};
use crate::shared_gate::SharedGate;

/// The oldest server the scripts run on: `ZADD … GT` came with Redis 6.2.
pub const MIN_REDIS_VERSION: (u32, u32) = (6, 2);

/// What the startup check found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerInfo {
    /// `redis` or `valkey` (as `HELLO` says).
    pub name: String,
    /// The version, e.g. `7.0.15`.
    pub version: String,
    /// What works but not as it should: the wake-up channels cannot be published to (the
    /// ACL user lacks the channel rights), so processes wake one another by polling only.
    pub warnings: Vec<String>,
    /// Live processes counted by the check's heartbeat, this one included.
    pub live: u32,
}

impl Store {
    /// A handle on the same server, configuration and health with a connection of its own
    /// (for a check on another runtime than the one the handle will serve).
    pub fn with_own_connection(&self) -> Result<Self, StoreError> {
        let mut store = Self::connect_lazy(self.config().clone())?;
        store.share_health_of(self);
        Ok(store)
    }

    /// Checks that the server can serve `gates` with this configuration, and beats the heartbeat
    /// of the process `instance` (kept for `heartbeat_ttl`): see the module docs. Bounded: one
    /// connect timeout plus a command timeout per command.
    pub async fn check(
        &self,
        gates: &[SharedGate],
        instance: &str,
        heartbeat_ttl: Duration,
    ) -> Result<ServerInfo, StoreError> {
        let mut info = self.server_info().await?;
        self.update_health(|h| h.server = Some(format!("{} {}", info.name, info.version)));
        self.preload_scripts().await?;
        // The process's first heartbeat: the fallback shares are known before its first
        // permit. Its TTL must be the scheduler's own: the script sets the whole key's expiry
        // to twice the TTL, so a short one would wipe every process's heartbeat.
        info.live = self.heartbeat(instance, heartbeat_ttl).await?;
        // Every command of every script path (classes, tenants, budgets, windows, wake-ups),
        // on scratch keys: a right the user lacks fails here, not under load. On a Cluster the
        // scratch keys' master may be the one that is down: that alone is only a warning.
        match self.check_paths(instance).await {
            Err(error) if error.is_outage() && !error.is_rejection() => {
                info.warnings.push(format!("could not run the scripts' paths on scratch keys: {error}"));
            }
            other => other?,
        }
        for gate in gates {
            // The fleet's live settings first, so that this process's first script calls (and
            // its claim) send the fleet's limit, not the one it was built with.
            gate.set_live(&gate.live(None).await?.unwrap_or_default());
            gate.reconcile(&[], &[], Duration::from_secs(1), OutageUsage::NONE).await?;
            // The scripts publish with `pcall` and waiters poll as well: without channel
            // rights wavegate works, only slower to wake another process's waiter.
            match gate.check_publish().await {
                Err(error) if error.rejection() == Some(Rejection::Permission) => {
                    info.warnings.push(format!("cannot publish on {}: {error}", gate.wake_channel()));
                }
                other => other?,
            }
            gate.claim_config().await?;
        }
        Ok(info)
    }

    /// The server's name and version, refused when older than [`MIN_REDIS_VERSION`].
    pub async fn server_info(&self) -> Result<ServerInfo, StoreError> {
        const COMMAND: &str = "HELLO";
        let bound = self.config().connect_timeout + self.config().command_timeout;
        let reply = self.bounded(COMMAND, bound, |mut c| async move { redis::cmd("HELLO").query_async(&mut c).await });
        let reply: Value = match reply.await {
            // Older than 6.0: no HELLO at all.
            Err(StoreError::Refused { source, .. })
                if source.detail().is_some_and(|d| d.contains("unknown command")) =>
            {
                return Err(StoreError::Rejected {
                    command: COMMAND,
                    reason: Rejection::Version,
                    detail: "the server does not know HELLO (older than Redis 6.0)".to_owned(),
                });
            }
            other => other?,
        };
        let fields = hello_fields(&reply)
            .ok_or_else(|| StoreError::unexpected(COMMAND, format!("a reply that is not a map: {reply:?}")))?;
        let field = |name: &str| fields.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone());
        let name = field("server").unwrap_or_else(|| "redis".to_owned());
        let version = field("version").ok_or_else(|| StoreError::unexpected(COMMAND, "no version in the reply"))?;
        let parsed = parse_version(&version)
            .ok_or_else(|| StoreError::unexpected(COMMAND, format!("cannot read version {version:?}")))?;
        // Valkey forked from Redis 7.2: every version of it has what the scripts need.
        if name == "redis" && parsed < MIN_REDIS_VERSION {
            let (major, minor) = MIN_REDIS_VERSION;
            return Err(StoreError::Rejected {
                command: COMMAND,
                reason: Rejection::Version,
                detail: format!("the server is redis {version}; wavegate needs {major}.{minor} or newer"),
            });
        }
        Ok(ServerInfo { name, version, warnings: Vec::new(), live: 0 })
    }
}

/// The string fields of a `HELLO` reply (an array of pairs in RESP2, a map in RESP3).
fn hello_fields(reply: &Value) -> Option<Vec<(String, String)>> {
    let text = |v: &Value| match v {
        Value::BulkString(bytes) => String::from_utf8(bytes.clone()).ok(),
        Value::SimpleString(s) => Some(s.clone()),
        Value::Int(n) => Some(n.to_string()),
        _ => None,
    };
    let pairs: Vec<(&Value, &Value)> = match reply {
        Value::Array(items) => items.chunks_exact(2).map(|p| (&p[0], &p[1])).collect(),
        Value::Map(pairs) => pairs.iter().map(|(k, v)| (k, v)).collect(),
        _ => return None,
    };
    Some(pairs.into_iter().filter_map(|(k, v)| Some((text(k)?, text(v)?))).collect())
}

/// `major.minor` of a version such as `7.0.15` or `6.2`.
pub(crate) fn parse_version(version: &str) -> Option<(u32, u32)> {
    let mut parts = version.split('.');
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next().map_or(Some(0), |m| m.parse().ok())?;
    Some((major, minor))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_are_read_and_compared() {
        assert_eq!(parse_version("7.0.15"), Some((7, 0)));
        assert_eq!(parse_version("6.2"), Some((6, 2)));
        assert!(parse_version("6.0.9").expect("parsed") < MIN_REDIS_VERSION);
        assert!(parse_version("6.2.0").expect("parsed") >= MIN_REDIS_VERSION);
        assert!(parse_version("10.0.1").expect("parsed") >= MIN_REDIS_VERSION);
        assert_eq!(parse_version("seven"), None);
    }
}
