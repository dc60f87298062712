//! The error type of the harness.

use std::io;
use std::path::PathBuf;
use std::process::ExitStatus;
use std::time::Duration;

use crate::REDIS_SERVER_ENV;

/// Everything that can go wrong while starting, signalling or talking to a
/// harness-managed `redis-server`.
///
/// Errors that happen while the server starts carry the tail of the server's
/// log (its log file and its captured stdout/stderr), so a failing test says
/// *why* Redis did not come up.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HarnessError {
    /// The `redis-server` binary (or the one configured) does not exist.
    #[error(
        "redis-server not found (looked for `{}`): install it (`apt-get install redis-server`) \
         or set {REDIS_SERVER_ENV} to its path",
        .binary.display()
    )]
    BinaryNotFound {
        /// The program the harness tried to run.
        binary: PathBuf,
    },

    /// The binary exists but could not be executed.
    #[error("failed to run `{}`: {source}", .binary.display())]
    Spawn {
        /// The program the harness tried to run.
        binary: PathBuf,
        /// Why the operating system refused.
        source: io::Error,
    },

    /// The server process exited before it answered `PING`.
    #[error("redis-server exited during startup on port {port} ({status})\n{log_tail}")]
    Exited {
        /// The port the server was asked to listen on.
        port: u16,
        /// How the process ended.
        status: ExitStatus,
        /// The last lines of the server's log and stdout/stderr.
        log_tail: String,
    },

    /// The server did not answer `PING` within the startup bound; it was killed.
    #[error("redis-server on port {port} was not ready within {timeout:?}; killed it\n{log_tail}")]
    StartTimeout {
        /// The port the server was asked to listen on.
        port: u16,
        /// The startup bound that elapsed.
        timeout: Duration,
        /// The last lines of the server's log and stdout/stderr.
        log_tail: String,
    },

    /// The operation needs a running server, but it was killed or stopped.
    #[error("redis-server is not running (call `restart()` first)")]
    NotRunning,

    /// Sending a signal to the server process failed.
    #[error("sending {signal} to redis-server (pid {pid}) failed: {source}")]
    Signal {
        /// The signal's name, e.g. `SIGSTOP`.
        signal: &'static str,
        /// The process id of the server.
        pid: u32,
        /// The error reported by `kill(2)`.
        source: io::Error,
    },

    /// A bounded wait on the server process elapsed.
    #[error("timed out after {timeout:?} waiting for redis-server to {action}")]
    Timeout {
        /// What the harness was waiting for, e.g. `exit after SIGKILL`.
        action: &'static str,
        /// The bound that elapsed.
        timeout: Duration,
    },

    /// A command sent by the harness itself (e.g. `SCRIPT FLUSH`) failed.
    #[error("redis command failed: {0}")]
    Redis(#[from] redis::RedisError),

    /// Any other I/O error (temp dir, log files, free port, process status).
    #[error("I/O error: {0}")]
    Io(#[from] io::Error),
}
