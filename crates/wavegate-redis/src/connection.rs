//! The connection to the shared store, with a bound on every command.
//!
//! A [`ConnectionManager`] reconnects by itself, but while the server is down its reconnect
//! retries would hold every command for seconds. wavegate instead sets no reconnect retries
//! (each command fails fast and the next one tries to reconnect), a connect timeout, a
//! response timeout, and wraps every command in its own timeout as well, so a hung server
//! (SIGSTOP, black-holed network) costs at most one command timeout per call.
//!
//! Behind Sentinel ([`StoreConfig::sentinel`]) the primary is asked of the sentinels, and
//! asked again after any outage of the connection to it: a failover is an outage (the
//! coordinator falls back, then reconciles with the promoted replica), never a silent switch.

use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};

use crate::error::StoreError;
use crate::health::{Health, StoreHealth};
use crate::keys::Keyspace;
use crate::sentinel::{self, SentinelConfig};

/// How to reach the shared store.
#[derive(Debug, Clone)]
pub struct StoreConfig {
    /// The server, e.g. `redis://127.0.0.1:6379/`, or `rediss://…` for TLS (the `tls`
    /// feature). Behind [`sentinel`](Self::sentinel) its host is ignored: its scheme, user,
    /// password and database apply to the primary the sentinels name.
    pub url: String,
    /// The longest any one command may take. Default 250 ms.
    pub command_timeout: Duration,
    /// The longest a connection attempt may take. Default 500 ms.
    pub connect_timeout: Duration,
    /// The key namespace.
    pub keyspace: Keyspace,
    /// Find the primary through Redis Sentinel instead of connecting to `url`'s host.
    pub sentinel: Option<SentinelConfig>,
    /// The certificate (PEM) a `rediss://` server must chain to, instead of the system's
    /// roots (a private CA, a self-signed server). Needs the `tls` feature.
    pub root_certificate: Option<Vec<u8>>,
    /// A Redis Cluster: these nodes' URLs are the seeds (the client learns the others), and
    /// `url` is not used. Empty: not a cluster. Needs the `cluster` feature.
    pub cluster_nodes: Vec<String>,
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
            sentinel: None,
            root_certificate: None,
            cluster_nodes: Vec::new(),
        }
    }

    /// A Redis Cluster reached through the seed `nodes` (`redis://host:port/`; credentials in
    /// their URLs). Needs the `cluster` feature.
    pub fn cluster(nodes: Vec<String>) -> Self {
        let url = nodes.first().cloned().unwrap_or_default();
        Self { cluster_nodes: nodes, ..Self::new(url) }
    }

    /// The primary of `master` as named by `sentinels` (`host:port` or `redis://host:port`);
    /// `url` gives the credentials, the database and the scheme for the primary (its host is
    /// ignored), e.g. `redis://:password@sentinel-managed/0`.
    pub fn sentinel(url: impl Into<String>, master: impl Into<String>, sentinels: Vec<String>) -> Self {
        Self { sentinel: Some(SentinelConfig { master: master.into(), sentinels }), ..Self::new(url) }
    }

    /// `single`, `sentinel` or `cluster`: how the server is found.
    pub fn topology(&self) -> &'static str {
        match (&self.sentinel, self.cluster_nodes.is_empty()) {
            (Some(_), _) => "sentinel",
            (None, false) => "cluster",
            (None, true) => "single",
        }
    }

    /// A client for `url`, or for the server at `address` with `url`'s scheme, credentials and
    /// database.
    pub(crate) fn client(&self, address: Option<(String, u16)>) -> Result<redis::Client, StoreError> {
        use redis::IntoConnectionInfo;
        let refused = |source| StoreError::Refused { command: "connect", source };
        if !cfg!(feature = "tls") && self.url.starts_with("rediss:") {
            return Err(StoreError::invalid("a rediss:// URL needs wavegate's `tls` feature"));
        }
        let mut info = self.url.as_str().into_connection_info().map_err(refused)?;
        if let Some((host, port)) = address {
            let addr = match info.addr().clone() {
                redis::ConnectionAddr::TcpTls { insecure, tls_params, .. } => {
                    redis::ConnectionAddr::TcpTls { host, port, insecure, tls_params }
                }
                _ => redis::ConnectionAddr::Tcp(host, port),
            };
            info = info.set_addr(addr);
        }
        match &self.root_certificate {
            None => redis::Client::open(info).map_err(refused),
            Some(root) => with_root_certificate(info, root),
        }
    }

    fn manager_config(&self) -> ConnectionManagerConfig {
        ConnectionManagerConfig::new()
            .set_number_of_retries(0)
            .set_connection_timeout(Some(self.connect_timeout))
            .set_response_timeout(Some(self.command_timeout))
    }
}

#[cfg(feature = "tls")]
fn with_root_certificate(info: redis::ConnectionInfo, root: &[u8]) -> Result<redis::Client, StoreError> {
    let certificates = redis::TlsCertificates { client_tls: None, root_cert: Some(root.to_vec()) };
    redis::Client::build_with_tls(info, certificates)
        .map_err(|source| StoreError::Refused { command: "connect", source })
}

#[cfg(not(feature = "tls"))]
fn with_root_certificate(_: redis::ConnectionInfo, _: &[u8]) -> Result<redis::Client, StoreError> {
    Err(StoreError::invalid("a root certificate needs wavegate's `tls` feature"))
}

/// The connection in use, replaced when it cannot recover by itself: behind Sentinel after
/// any outage (the primary may have changed), and after a failed authentication (a
/// [`ConnectionManager`] whose reconnect was refused the password does not try again).
struct Link {
    current: Mutex<Option<Connection>>,
    /// One new connection (or one question to the sentinels) at a time.
    renewing: tokio::sync::Mutex<()>,
}

/// What a heartbeat found ([`Store::beat`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Heartbeat {
    /// Live processes, this one included.
    pub live: u32,
    /// Whether this process is the fleet's gauge reader until its next heartbeat.
    pub gauge_reader: bool,
}

/// A cheap-to-clone handle on the shared store.
#[derive(Clone)]
pub struct Store {
    link: Arc<Link>,
    config: StoreConfig,
    health: Arc<Mutex<Health>>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store").field("config", &self.config).finish_non_exhaustive()
    }
}

impl Store {
    /// A handle that connects lazily: it never fails because the server is down now; the
    /// first commands will (as outages) until it is up. Fails on a URL that cannot be used
    /// (e.g. `rediss://` without the `tls` feature).
    pub fn connect_lazy(config: StoreConfig) -> Result<Self, StoreError> {
        let current = match (&config.sentinel, config.cluster_nodes.is_empty()) {
            (Some(_), false) => return Err(StoreError::invalid("a store is either behind Sentinel or a Cluster")),
            (Some(sentinel), true) => {
                sentinel.validate()?;
                // The URL must be usable for the primary.
                config.client(None)?;
                None
            }
            // Connected by the first command (the cluster client connects eagerly).
            (None, false) => {
                crate::cluster::client(&config)?;
                None
            }
            (None, true) => Some(Connection::Single(Self::manager(&config, config.client(None)?, "connect")?)),
        };
        let link = Link { current: Mutex::new(current), renewing: tokio::sync::Mutex::new(()) };
        Ok(Self { link: Arc::new(link), config, health: Arc::default() })
    }

    /// Connects and loads the scripts; fails (as an outage) when the server cannot be reached.
    pub async fn connect(config: StoreConfig) -> Result<Self, StoreError> {
        let store = Self::connect_lazy(config)?;
        store.preload_scripts().await?;
        Ok(store)
    }

    /// Loads every script into the server's cache.
    pub async fn preload_scripts(&self) -> Result<(), StoreError> {
        // Connecting and six SCRIPT LOADs: give it the connect timeout on top.
        let bound = self.config.connect_timeout + self.config.command_timeout * 6;
        self.bounded("SCRIPT LOAD", bound, |mut c| async move { crate::scripts::preload(&mut c).await }).await
    }

    /// `PING`, for health probes.
    pub async fn ping(&self) -> Result<(), StoreError> {
        let timeout = self.config.command_timeout;
        let pong: String =
            self.bounded("PING", timeout, |mut c| async move { redis::cmd("PING").query_async(&mut c).await }).await?;
        if pong == "PONG" { Ok(()) } else { Err(StoreError::unexpected("PING", format!("{pong:?}"))) }
    }

    /// Records a heartbeat of `instance`, counting for `ttl`; returns how many instances are
    /// live (this one included). Takes no part in the choice of the gauge reader.
    pub async fn heartbeat(&self, instance: &str, ttl: Duration) -> Result<u32, StoreError> {
        Ok(self.beat(instance, ttl, Duration::ZERO, None).await?.live)
    }

    /// Records a heartbeat of `instance`, counting for `ttl`, and takes part in the choice of
    /// the fleet's gauge reader with turns of `reader_turn` (zero: no part): the one process
    /// that reads the shared gauges (budgets left, learned limits) for the whole fleet, so
    /// their cost does not grow with the number of processes. A reader keeps its turn as long
    /// as it beats within `reader_turn`; when it stops, the next process to beat takes over.
    /// With `mode` = (its mode now, the mode it told last or `""`), the process's mode as an
    /// operator reads it (`shared`, `fallback 2/100`, ...) is kept beside its heartbeat, for
    /// as long as the heartbeat counts ([`live_processes`](crate::live_processes) reads them).
    pub async fn beat(
        &self,
        instance: &str,
        ttl: Duration,
        reader_turn: Duration,
        mode: Option<(&str, &str)>,
    ) -> Result<Heartbeat, StoreError> {
        const COMMAND: &str = "heartbeat";
        let instances = self.config.keyspace.instances();
        let call = crate::calls::heartbeat(&instances, instance, ttl, reader_turn, mode);
        let reply: Vec<redis::Value> =
            self.invoke(COMMAND, &call.invocation(&crate::scripts::scripts().heartbeat)).await?;
        let r = crate::calls::Reply::new(COMMAND, &reply);
        r.expect_len(2)?;
        Ok(Heartbeat { live: r.u32(0)?, gauge_reader: r.uint(1)? == 1 })
    }

    /// The store's configuration.
    pub fn config(&self) -> &StoreConfig {
        &self.config
    }

    /// What this handle (and its clones) found out about the server: its version, a rejection
    /// of the credentials or rights, upstreams configured otherwise by another process.
    pub fn health(&self) -> StoreHealth {
        self.health.lock().unwrap_or_else(PoisonError::into_inner).snapshot(&self.config)
    }

    pub(crate) fn share_health_of(&mut self, other: &Store) {
        self.health = other.health.clone();
    }

    pub(crate) fn update_health(&self, update: impl FnOnce(&mut Health)) {
        update(&mut self.health.lock().unwrap_or_else(PoisonError::into_inner));
    }

    /// Runs one script invocation under the command timeout.
    pub(crate) async fn invoke<T: redis::FromRedisValue>(
        &self,
        command: &'static str,
        invocation: &redis::ScriptInvocation<'_>,
    ) -> Result<T, StoreError> {
        self.bounded(command, self.config.command_timeout, |mut c| async move { invocation.invoke_async(&mut c).await })
            .await
    }

    /// Runs one command an operator's tool needs (`wavegate status` reads claims and windows)
    /// under the command timeout, through the same connection, TLS, credentials and Sentinel
    /// as the scripts. Not used by the scheduler (the minimal ACL user need not allow it).
    pub async fn query<T>(&self, command: &'static str, cmd: redis::Cmd) -> Result<T, StoreError>
    where
        T: redis::FromRedisValue + Send + 'static,
    {
        let timeout = self.config.command_timeout;
        self.bounded(command, timeout, |mut c| async move { cmd.query_async(&mut c).await }).await
    }

    /// Runs one command (`f` on a connection) under `timeout`, finding the connection
    /// included. A rejection is recorded in the health, a success clears it; behind Sentinel
    /// an outage makes the next command ask the sentinels for the primary again.
    pub(crate) async fn bounded<T, F, Fut>(
        &self,
        command: &'static str,
        timeout: Duration,
        f: F,
    ) -> Result<T, StoreError>
    where
        F: FnOnce(Connection) -> Fut,
        Fut: Future<Output = redis::RedisResult<T>>,
    {
        let timeout_ms = u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX);
        let run = async {
            let connection = self.connection(command).await?;
            f(connection).await.map_err(|error| StoreError::from_redis(command, timeout_ms, error))
        };
        let result = match tokio::time::timeout(timeout, run).await {
            Ok(result) => result,
            Err(_) => Err(StoreError::Timeout { command, timeout_ms }),
        };
        match &result {
            Ok(_) => self.update_health(Health::served),
            Err(error) => {
                if let StoreError::Rejected { reason, detail, .. } = error {
                    self.update_health(|h| h.rejected(*reason, detail));
                }
                let sentinel = self.config.sentinel.is_some() && error.is_outage();
                if sentinel || error.rejection() == Some(crate::error::Rejection::Authentication) {
                    self.forget_connection();
                }
            }
        }
        result
    }

    /// The connection to use now (a new one if the last was forgotten; behind Sentinel the
    /// sentinels are asked for the primary first).
    async fn connection(&self, command: &'static str) -> Result<Connection, StoreError> {
        let current = || self.link.current.lock().unwrap_or_else(PoisonError::into_inner).clone();
        if let Some(connection) = current() {
            return Ok(connection);
        }
        let _renewing = self.link.renewing.lock().await;
        if let Some(connection) = current() {
            return Ok(connection);
        }
        let connection = if self.config.cluster_nodes.is_empty() {
            Connection::Single(Self::manager(&self.config, self.primary_client(command).await?, command)?)
        } else {
            crate::cluster::connect(&self.config, command).await?
        };
        *self.link.current.lock().unwrap_or_else(PoisonError::into_inner) = Some(connection.clone());
        Ok(connection)
    }

    fn manager(
        config: &StoreConfig,
        client: redis::Client,
        command: &'static str,
    ) -> Result<ConnectionManager, StoreError> {
        ConnectionManager::new_lazy_with_config(client, config.manager_config())
            .map_err(|source| StoreError::Refused { command, source })
    }

    /// The clients to subscribe through, in order of preference: the server, the primary the
    /// sentinels name, or each seed of a cluster (a plain `PUBLISH` reaches every node).
    pub(crate) async fn subscription_clients(&self, command: &'static str) -> Result<Vec<redis::Client>, StoreError> {
        if self.config.cluster_nodes.is_empty() {
            return Ok(vec![self.primary_client(command).await?]);
        }
        let refused = |source| StoreError::Refused { command, source };
        self.config.cluster_nodes.iter().map(|node| redis::Client::open(node.as_str()).map_err(refused)).collect()
    }

    /// A client for the server to use now: the URL's, or the primary the sentinels name.
    pub(crate) async fn primary_client(&self, command: &'static str) -> Result<redis::Client, StoreError> {
        match &self.config.sentinel {
            None => self.config.client(None),
            Some(sentinel) => {
                let primary = sentinel::find_primary(sentinel, &self.config, command).await?;
                let client = self.config.client(Some(primary.clone()))?;
                sentinel::confirm_primary(&client, &self.config, command).await?;
                self.update_health(|h| h.primary = Some(format!("{}:{}", primary.0, primary.1)));
                Ok(client)
            }
        }
    }

    fn forget_connection(&self) {
        *self.link.current.lock().unwrap_or_else(PoisonError::into_inner) = None;
    }
}

/// A connection to a single server (or the primary behind Sentinel), or to a Cluster.
#[derive(Clone)]
pub(crate) enum Connection {
    Single(ConnectionManager),
    #[cfg(feature = "cluster")]
    Cluster(redis::cluster_async::ClusterConnection),
}

impl redis::aio::ConnectionLike for Connection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a redis::Cmd) -> redis::RedisFuture<'a, redis::Value> {
        match self {
            Connection::Single(c) => c.req_packed_command(cmd),
            #[cfg(feature = "cluster")]
            Connection::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> redis::RedisFuture<'a, Vec<redis::Value>> {
        match self {
            Connection::Single(c) => c.req_packed_commands(pipeline, offset, count),
            #[cfg(feature = "cluster")]
            Connection::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Connection::Single(c) => c.get_db(),
            #[cfg(feature = "cluster")]
            Connection::Cluster(c) => c.get_db(),
        }
    }
}
