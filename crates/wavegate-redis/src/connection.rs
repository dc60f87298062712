//! The connection to the shared store, with a bound on every command.
//!
//! A [`ConnectionManager`] reconnects by itself, but while the server is down its reconnect
//! retries would hold every command for seconds. wavegate instead sets no reconnect retries
//! (each command fails fast and the next one tries to reconnect), a connect timeout, a
//! response timeout, and wraps every command in its own timeout as well, so a hung server
//! (SIGSTOP, black-holed network) costs at most one command timeout per call.

use std::future::Future;
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};

use crate::error::StoreError;
use crate::keys::Keyspace;

/// How to reach the shared store.
#[derive(Debug, Clone)]
pub struct StoreConfig {
    /// The server, e.g. `redis://127.0.0.1:6379/`.
    pub url: String,
    /// The longest any one command may take. Default 250 ms.
    pub command_timeout: Duration,
    /// The longest a connection attempt may take. Default 500 ms.
    pub connect_timeout: Duration,
    /// The key namespace.
    pub keyspace: Keyspace,
}

impl StoreConfig {
    /// The default command timeout: 250 ms.
    pub const DEFAULT_COMMAND_TIMEOUT: Duration = Duration::from_millis(250);
    /// The default connect timeout: 500 ms.
    pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_millis(500);

    /// The defaults for the server at `url`.
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            command_timeout: Self::DEFAULT_COMMAND_TIMEOUT,
            connect_timeout: Self::DEFAULT_CONNECT_TIMEOUT,
            keyspace: Keyspace::default(),
        }
    }
}

/// A cheap-to-clone handle on the shared store.
#[derive(Clone)]
pub struct Store {
    connection: ConnectionManager,
    config: StoreConfig,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store").field("config", &self.config).finish_non_exhaustive()
    }
}

impl Store {
    /// A handle that connects lazily: it never fails because the server is down now; the
    /// first commands will (as outages) until it is up.
    pub fn connect_lazy(config: StoreConfig) -> Result<Self, StoreError> {
        let client = redis::Client::open(config.url.as_str())
            .map_err(|e| StoreError::Refused { command: "connect", source: e })?;
        let manager_config = ConnectionManagerConfig::new()
            .set_number_of_retries(0)
            .set_connection_timeout(Some(config.connect_timeout))
            .set_response_timeout(Some(config.command_timeout));
        let connection = ConnectionManager::new_lazy_with_config(client, manager_config)
            .map_err(|e| StoreError::Refused { command: "connect", source: e })?;
        Ok(Self { connection, config })
    }

    /// Connects and loads the scripts; fails (as an outage) when the server cannot be reached.
    pub async fn connect(config: StoreConfig) -> Result<Self, StoreError> {
        let store = Self::connect_lazy(config)?;
        store.preload_scripts().await?;
        Ok(store)
    }

    /// Loads every script into the server's cache.
    pub async fn preload_scripts(&self) -> Result<(), StoreError> {
        let mut connection = self.connection.clone();
        // Connecting and four SCRIPT LOADs: give it the connect timeout on top.
        let bound = self.config.connect_timeout + self.config.command_timeout * 4;
        self.bounded("SCRIPT LOAD", bound, crate::scripts::preload(&mut connection)).await
    }

    /// `PING`, for health probes.
    pub async fn ping(&self) -> Result<(), StoreError> {
        let mut connection = self.connection.clone();
        let timeout = self.config.command_timeout;
        let pong: String = self.bounded("PING", timeout, redis::cmd("PING").query_async(&mut connection)).await?;
        if pong == "PONG" { Ok(()) } else { Err(StoreError::unexpected("PING", format!("{pong:?}"))) }
    }

    /// Records a heartbeat of `instance`, counting for `ttl`; returns how many instances are
    /// live (this one included).
    pub async fn heartbeat(&self, instance: &str, ttl: Duration) -> Result<u32, StoreError> {
        const COMMAND: &str = "heartbeat";
        let mut invocation = crate::scripts::scripts().heartbeat.prepare_invoke();
        invocation.key(self.config.keyspace.instances()).arg(instance).arg(wavegate_core::duration_ms(ttl).max(1));
        let live: i64 = self.invoke(COMMAND, &invocation).await?;
        u32::try_from(live).map_err(|_| StoreError::unexpected(COMMAND, format!("instance count {live}")))
    }

    /// The store's configuration.
    pub fn config(&self) -> &StoreConfig {
        &self.config
    }

    /// Runs one script invocation under the command timeout.
    pub(crate) async fn invoke<T: redis::FromRedisValue>(
        &self,
        command: &'static str,
        invocation: &redis::ScriptInvocation<'_>,
    ) -> Result<T, StoreError> {
        let mut connection = self.connection.clone();
        self.bounded(command, self.config.command_timeout, invocation.invoke_async(&mut connection)).await
    }

    /// Runs one command under the command timeout.
    pub(crate) async fn bounded<T>(
        &self,
        command: &'static str,
        timeout: Duration,
        future: impl Future<Output = redis::RedisResult<T>>,
    ) -> Result<T, StoreError> {
        let timeout_ms = u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX);
        match tokio::time::timeout(timeout, future).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(error)) => Err(StoreError::from_redis(command, timeout_ms, error)),
            Err(_) => Err(StoreError::Timeout { command, timeout_ms }),
        }
    }
}
