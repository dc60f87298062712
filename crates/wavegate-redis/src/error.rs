//! What can go wrong talking to the shared store, sorted by what the caller should do.

use redis::{ErrorKind, RedisError, ServerErrorKind};

/// A failed store command.
///
/// [`is_outage`](StoreError::is_outage) tells the coordinator to switch to local fallback:
/// timeouts, refused or dropped connections, `BUSY`, `LOADING`, failed authentication, out of
/// memory (`OOM`), failed persistence (`MISCONF`), a read-only replica, too many clients, a
/// Cluster that is down or redirects (no Cluster client yet). Everything else is a bug or a corrupted reply and is reported as
/// such, not hidden behind a mode switch.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// No reply within the command timeout (a hung or paused server, a black-holed network).
    #[error("redis `{command}` timed out after {timeout_ms} ms")]
    Timeout {
        /// The command or script.
        command: &'static str,
        /// The timeout that ran out.
        timeout_ms: u64,
    },
    /// The server cannot be used now: connection refused, reset or dropped; BUSY; LOADING;
    /// authentication; Cluster down.
    #[error("redis unavailable during `{command}`: {source}")]
    Unavailable {
        /// The command or script.
        command: &'static str,
        /// The client's error.
        #[source]
        source: RedisError,
    },
    /// The server refused the command itself (a script error: a wavegate bug, or arguments
    /// the scripts reject).
    #[error("redis refused `{command}`: {source}")]
    Refused {
        /// The command or script.
        command: &'static str,
        /// The client's error.
        #[source]
        source: RedisError,
    },
    /// The reply did not have the shape the script promises.
    #[error("unexpected reply to `{command}`: {detail}")]
    UnexpectedReply {
        /// The command or script.
        command: &'static str,
        /// What was wrong.
        detail: String,
    },
}

impl StoreError {
    /// Whether the store is (for now) out of reach, so the caller should fail open.
    pub fn is_outage(&self) -> bool {
        matches!(self, StoreError::Timeout { .. } | StoreError::Unavailable { .. })
    }

    /// Whether this was a timeout.
    pub fn is_timeout(&self) -> bool {
        matches!(self, StoreError::Timeout { .. })
    }

    /// A short stable label for metrics: `timeout`, `unavailable`, `refused`, `unexpected_reply`.
    pub const fn label(&self) -> &'static str {
        match self {
            StoreError::Timeout { .. } => "timeout",
            StoreError::Unavailable { .. } => "unavailable",
            StoreError::Refused { .. } => "refused",
            StoreError::UnexpectedReply { .. } => "unexpected_reply",
        }
    }

    pub(crate) fn from_redis(command: &'static str, timeout_ms: u64, error: RedisError) -> Self {
        if error.is_timeout() {
            return StoreError::Timeout { command, timeout_ms };
        }
        let unavailable = error.is_io_error()
            || error.is_connection_dropped()
            || error.is_connection_refusal()
            || matches!(
                error.code(),
                Some(
                    "BUSY"
                        | "LOADING"
                        | "MASTERDOWN"
                        | "NOAUTH"
                        | "WRONGPASS"
                        | "OOM"
                        | "MISCONF"
                        | "READONLY"
                        | "CLUSTERDOWN"
                        | "MOVED"
                        | "ASK"
                        | "TRYAGAIN"
                        | "NOREPLICAS"
                )
            )
            || error.detail().is_some_and(|detail| detail.contains("max number of clients"))
            || matches!(
                error.kind(),
                ErrorKind::AuthenticationFailed
                    | ErrorKind::Server(
                        ServerErrorKind::BusyLoading
                            | ServerErrorKind::ClusterDown
                            | ServerErrorKind::MasterDown
                            | ServerErrorKind::TryAgain
                            | ServerErrorKind::ReadOnly
                    )
            );
        if unavailable {
            StoreError::Unavailable { command, source: error }
        } else {
            StoreError::Refused { command, source: error }
        }
    }

    pub(crate) fn unexpected(command: &'static str, detail: impl Into<String>) -> Self {
        StoreError::UnexpectedReply { command, detail: detail.into() }
    }
}
