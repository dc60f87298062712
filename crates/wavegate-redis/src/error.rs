//! What can go wrong talking to the shared store, sorted by what the caller should do.

use redis::{ErrorKind, RedisError, ServerErrorKind};

/// A failed store command.
///
/// [`is_outage`](StoreError::is_outage) tells the coordinator to switch to local fallback:
/// timeouts, refused or dropped connections, `BUSY`, `LOADING`, out of memory (`OOM`), failed
/// persistence (`MISCONF`), a read-only replica (a demoted primary), too many clients, a
/// Cluster that is down or redirects (no Cluster client yet) — and a [`Rejected`] client
/// (wrong password, missing ACL rights, a server too old), which must fail open too but is
/// not a passing outage: [`is_rejection`](StoreError::is_rejection) tells it apart, so it is
/// shown and logged as what it is. Everything else is a bug or a corrupted reply and is
/// reported as such, not hidden behind a mode switch.
///
/// [`Rejected`]: StoreError::Rejected
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
    /// The server answers but will not serve wavegate: the credentials are wrong, the ACL user
    /// lacks a right the scripts need, or the server is older than wavegate needs. It will not
    /// pass by itself; the message says what to change.
    #[error("redis rejected wavegate during `{command}`: {reason}: {detail}")]
    Rejected {
        /// The command or script.
        command: &'static str,
        /// Why.
        reason: Rejection,
        /// The server's words, or what was found.
        detail: String,
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
    /// The store's configuration cannot work (a `rediss://` URL without the `tls` feature, a
    /// Sentinel setup without sentinels, …); the message says what to change.
    #[error("{detail}")]
    Invalid {
        /// What is wrong.
        detail: String,
    },
    /// The upstream's state is gone while this process counted on it: the state holds no
    /// generation, or another one than this process last saw (`FLUSHALL`, an eviction, an
    /// empty restart without a dropped connection). The script changed nothing. An outage of
    /// a kind: the process handles it as an empty restart (its fallback share, then a
    /// reconciliation that registers its permits again).
    #[error("redis lost the upstream's state before `{command}` (FLUSHALL, an eviction or an empty restart)")]
    StateLost {
        /// The command or script.
        command: &'static str,
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
    /// True for a [`Rejected`](StoreError::Rejected) client as well: it cannot share either.
    pub fn is_outage(&self) -> bool {
        matches!(
            self,
            StoreError::Timeout { .. }
                | StoreError::Unavailable { .. }
                | StoreError::Rejected { .. }
                | StoreError::StateLost { .. }
        )
    }

    /// Whether the store lost the upstream's state under this process (see
    /// [`StateLost`](StoreError::StateLost)).
    pub fn is_state_lost(&self) -> bool {
        matches!(self, StoreError::StateLost { .. })
    }

    /// Why the server rejects wavegate, when it does (wrong credentials, missing rights, too
    /// old): an operator must act; waiting does not help.
    pub fn rejection(&self) -> Option<Rejection> {
        match self {
            StoreError::Rejected { reason, .. } => Some(*reason),
            _ => None,
        }
    }

    /// Whether the server rejects wavegate (see [`rejection`](Self::rejection)).
    pub fn is_rejection(&self) -> bool {
        self.rejection().is_some()
    }

    /// Whether this was a timeout.
    pub fn is_timeout(&self) -> bool {
        matches!(self, StoreError::Timeout { .. })
    }

    /// A short stable label for metrics: `timeout`, `unavailable`, `authentication`,
    /// `permission`, `version`, `tls`, `sentinel`, `refused`, `invalid`, `state_lost`,
    /// `unexpected_reply`.
    pub const fn label(&self) -> &'static str {
        match self {
            StoreError::Timeout { .. } => "timeout",
            StoreError::Unavailable { .. } => "unavailable",
            StoreError::Rejected { reason, .. } => reason.as_str(),
            StoreError::Refused { .. } => "refused",
            StoreError::Invalid { .. } => "invalid",
            StoreError::StateLost { .. } => "state_lost",
            StoreError::UnexpectedReply { .. } => "unexpected_reply",
        }
    }

    pub(crate) fn from_redis(command: &'static str, timeout_ms: u64, error: RedisError) -> Self {
        if error.is_timeout() {
            return StoreError::Timeout { command, timeout_ms };
        }
        if error.code() == Some("WAVEGATE_LOST") {
            return StoreError::StateLost { command };
        }
        if let Some(reason) = Rejection::of(&error) {
            let mut detail = error.to_string();
            if let Some(missing) = denied_command(command, &detail) {
                detail = format!("{} (add `+{missing}` to the ACL user)", detail.trim_end_matches('.'));
            }
            return StoreError::Rejected { command, reason, detail };
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
                ErrorKind::Server(
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

    /// A configuration that cannot work, saying what to change.
    pub fn invalid(detail: impl Into<String>) -> Self {
        StoreError::Invalid { detail: detail.into() }
    }

    /// A reply of `command` that does not have the shape its script promises.
    pub fn unexpected(command: &'static str, detail: impl Into<String>) -> Self {
        StoreError::UnexpectedReply { command, detail: detail.into() }
    }
}

/// Why a server rejects wavegate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Rejection {
    /// Wrong or missing credentials (`WRONGPASS`, `NOAUTH`, a disabled user): check the user
    /// and password in the URL.
    Authentication,
    /// The ACL user may not run a command or touch a key the scripts need (`NOPERM`): see the
    /// minimal user in `docs/redis.md`.
    Permission,
    /// The server is older than Redis 6.2 (the scripts use `ZADD GT`).
    Version,
    /// The TLS handshake failed: the server's certificate does not chain to a trusted root
    /// or does not name the host, or the port does not speak TLS.
    Tls,
    /// The sentinels monitor no master by the configured name.
    Sentinel,
}

impl Rejection {
    /// `authentication`, `permission` or `version`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Rejection::Authentication => "authentication",
            Rejection::Permission => "permission",
            Rejection::Version => "version",
            Rejection::Tls => "tls",
            Rejection::Sentinel => "sentinel",
        }
    }

    /// What the operator should do.
    pub const fn advice(self) -> &'static str {
        match self {
            Rejection::Authentication => "check the user name and password of the Redis URL",
            Rejection::Permission => "grant the ACL user the keys, channels and commands listed in docs/redis.md",
            Rejection::Version => "wavegate needs Redis 6.2 or newer (or Valkey)",
            Rejection::Sentinel => "check the master name: the sentinels monitor none by this name",
            Rejection::Tls => {
                "check the server's certificate, the root certificate given (StoreConfig::root_certificate) and that the port speaks TLS"
            }
        }
    }

    fn of(error: &RedisError) -> Option<Self> {
        let detail = error.detail().unwrap_or_default();
        match (error.kind(), error.code()) {
            (ErrorKind::AuthenticationFailed, _) | (_, Some("NOAUTH" | "WRONGPASS")) => Some(Rejection::Authentication),
            (ErrorKind::Server(ServerErrorKind::NoPerm), _) | (_, Some("NOPERM")) => Some(Rejection::Permission),
            // A command inside a script that the user may not run, or a key it may not touch.
            _ if detail.contains("The user executing the script can't") => Some(Rejection::Permission),
            _ if is_tls_failure(error) => Some(Rejection::Tls),
            _ => None,
        }
    }
}

impl std::fmt::Display for Rejection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.as_str(), self.advice())
    }
}

/// The command a permission error says the user may not run: named by the server for a
/// command sent directly (`... to run the 'set' command`), or found on the line of the script
/// it names (`... script: <sha>, on @user_script:<line>.`: Redis does not name the command).
fn denied_command(command: &str, detail: &str) -> Option<String> {
    if let Some(at) = detail.find("permissions to run the '") {
        let rest = &detail[at + "permissions to run the '".len()..];
        return Some(rest[..rest.find('\'')?].to_lowercase());
    }
    let at = detail.find("@user_script:")? + "@user_script:".len();
    let line: usize = detail[at..].split(|c: char| !c.is_ascii_digit()).next()?.parse().ok()?;
    crate::scripts::command_at(crate::scripts::source_of(command)?, line)
}

/// Whether `error` is a failed TLS handshake. The client keeps rustls's error behind an `Arc`
/// inside an `io::Error`, out of reach of `downcast_ref`, so its words are read instead
/// (rustls's `Display` of the errors a handshake ends with).
#[cfg(feature = "tls")]
fn is_tls_failure(error: &RedisError) -> bool {
    const HANDSHAKE_FAILURES: [&str; 5] = [
        "invalid peer certificate",
        "received corrupt message",
        "received fatal alert",
        "peer is incompatible",
        "peer misbehaved",
    ];
    error.is_io_error() && {
        let words = error.to_string();
        HANDSHAKE_FAILURES.iter().any(|failure| words.contains(failure))
    }
}

#[cfg(not(feature = "tls"))]
fn is_tls_failure(_: &RedisError) -> bool {
    false
}
