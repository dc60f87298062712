//! Configuring a [`RedisServer`] before starting it.

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

use crate::{HarnessError, REDIS_SERVER_ENV, RedisServer};

/// How long [`RedisServerBuilder::start`] waits for `PING` by default.
pub(crate) const DEFAULT_STARTUP_TIMEOUT: Duration = Duration::from_secs(10);

/// Builds a [`RedisServer`]; obtained from [`RedisServer::builder`].
///
/// ```no_run
/// use wavegate_testkit::RedisServer;
///
/// let server = RedisServer::builder()
///     .binary("/opt/redis/bin/redis-server")
///     .extra_arg("--maxmemory")
///     .extra_arg("10mb")
///     .start()?;
/// # Ok::<(), wavegate_testkit::HarnessError>(())
/// ```
#[derive(Debug, Clone)]
#[must_use = "a builder does nothing until `start()` is called"]
pub struct RedisServerBuilder {
    binary: Option<PathBuf>,
    extra_args: Vec<OsString>,
    startup_timeout: Duration,
}

impl Default for RedisServerBuilder {
    fn default() -> Self {
        Self { binary: None, extra_args: Vec::new(), startup_timeout: DEFAULT_STARTUP_TIMEOUT }
    }
}

impl RedisServerBuilder {
    /// The `redis-server` program to run: a path, or a name looked up on `PATH`.
    ///
    /// Without this, the value of the `WAVEGATE_REDIS_SERVER` environment
    /// variable is used if set and non-empty, else `redis-server`.
    pub fn binary(mut self, path: impl Into<PathBuf>) -> Self {
        self.binary = Some(path.into());
        self
    }

    /// Appends one command-line argument, e.g. `--maxmemory` then `10mb`.
    ///
    /// Extra arguments come after the harness's own (`--port`, `--bind`,
    /// `--save ""`, `--appendonly no`, `--dir`, `--logfile`, …) so they can
    /// override them, except for the port, which the harness relies on.
    pub fn extra_arg(mut self, arg: impl Into<OsString>) -> Self {
        self.extra_args.push(arg.into());
        self
    }

    /// How long to wait for the server to answer `PING` after each launch
    /// (start and restart). Defaults to 10 seconds.
    pub fn startup_timeout(mut self, timeout: Duration) -> Self {
        self.startup_timeout = timeout;
        self
    }

    /// Starts the server on a free port and waits until it answers `PING`.
    ///
    /// # Errors
    ///
    /// See [`RedisServer::start`].
    pub fn start(self) -> Result<RedisServer, HarnessError> {
        RedisServer::start_with(self.into_config())
    }

    fn into_config(self) -> ServerConfig {
        ServerConfig {
            binary: self.binary.unwrap_or_else(default_binary),
            extra_args: self.extra_args,
            startup_timeout: self.startup_timeout,
        }
    }
}

/// The resolved launch configuration, kept for restarts.
#[derive(Debug, Clone)]
pub(crate) struct ServerConfig {
    pub(crate) binary: PathBuf,
    pub(crate) extra_args: Vec<OsString>,
    pub(crate) startup_timeout: Duration,
}

/// `$WAVEGATE_REDIS_SERVER` if set and non-empty, else `redis-server`.
fn default_binary() -> PathBuf {
    std::env::var_os(REDIS_SERVER_ENV)
        .filter(|value| !value.is_empty())
        .map_or_else(|| PathBuf::from("redis-server"), PathBuf::from)
}
