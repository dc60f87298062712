//! A primary, a replica and three sentinels on loopback: Redis as Sentinel deploys it.
//!
//! [`SentinelGroup::start`] starts a primary ([`RedisServer`]), a replica of it (replicating
//! through a [`FaultProxy`], so [`SentinelGroup::cut_replication`] can make it miss the
//! primary's writes from then on, as an asynchronous replica does when its primary dies), and
//! three
//! `redis-server --sentinel` processes that monitor the primary as [`SentinelGroup::MASTER`]
//! with a quorum of 2 and `down-after-milliseconds` 500, so a
//! `kill -9` of the primary ([`SentinelGroup::primary`] then [`RedisServer::kill`]) promotes
//! the replica within a few seconds. (`failover-timeout` is 60 s: a sentinel points a replica
//! that follows another address than the primary's — the proxy — back at the primary once
//! that long has passed since it found it.) Every process runs in a temporary directory on a free
//! port and is killed on drop.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use tempfile::TempDir;

use crate::process::kill_and_reap;
use crate::{Fault, FaultProxy, HarnessError, RedisServer, free_port};

/// How long the group has to come up: the replica in sync, the sentinels aware of it.
const READY_TIMEOUT: Duration = Duration::from_secs(20);
const KILL_TIMEOUT: Duration = Duration::from_secs(5);
const POLL: Duration = Duration::from_millis(50);

/// One `redis-server --sentinel` process; killed on drop.
#[derive(Debug)]
pub struct SentinelProcess {
    child: Option<Child>,
    port: u16,
    log: PathBuf,
}

impl SentinelProcess {
    /// The sentinel's address, `127.0.0.1:{port}`.
    pub fn address(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Kills it (`kill -9`).
    ///
    /// # Errors
    ///
    /// If the process cannot be signalled or reaped within 5 s.
    pub fn kill(&mut self) -> Result<(), HarnessError> {
        if let Some(mut child) = self.child.take() {
            kill_and_reap(&mut child, KILL_TIMEOUT)?;
        }
        Ok(())
    }

    /// The tail of its log.
    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }

    fn client(&self) -> Result<redis::Connection, HarnessError> {
        let client = redis::Client::open(format!("redis://{}/", self.address()))?;
        let con = client.get_connection_with_timeout(Duration::from_millis(500))?;
        con.set_read_timeout(Some(Duration::from_secs(1)))?;
        Ok(con)
    }
}

impl Drop for SentinelProcess {
    fn drop(&mut self) {
        let _ = self.kill();
    }
}

/// A primary, its replica and three sentinels; all killed on drop.
#[derive(Debug)]
pub struct SentinelGroup {
    primary: RedisServer,
    replica: RedisServer,
    replication: FaultProxy,
    sentinels: Vec<SentinelProcess>,
    _dir: TempDir,
}

impl SentinelGroup {
    /// The name the sentinels monitor the primary under.
    pub const MASTER: &'static str = "wavegate-primary";

    /// Starts the group and waits until the replica is in sync and every sentinel knows
    /// the primary and the replica.
    ///
    /// # Errors
    ///
    /// As for [`RedisServer::start`]; [`HarnessError::Timeout`] if the group is not ready
    /// within 20 s.
    pub fn start() -> Result<Self, HarnessError> {
        let primary = RedisServer::start()?;
        let replication = FaultProxy::start(primary.addr())?;
        let replica = RedisServer::builder()
            .extra_arg("--replicaof")
            .extra_arg("127.0.0.1")
            .extra_arg(replication.addr().port().to_string())
            .start()?;
        let dir = tempfile::Builder::new().prefix("wavegate-sentinels-").tempdir()?;
        let mut sentinels = Vec::new();
        for i in 0..3 {
            let port = free_port()?;
            let config = dir.path().join(format!("sentinel-{i}.conf"));
            let log = dir.path().join(format!("sentinel-{i}.log"));
            std::fs::write(
                &config,
                format!(
                    "port {port}\nbind 127.0.0.1\ndaemonize no\ndir {dir}\nlogfile {log}\n\
                     sentinel monitor {master} 127.0.0.1 {primary} 2\n\
                     sentinel down-after-milliseconds {master} 500\n\
                     sentinel failover-timeout {master} 60000\n\
                     sentinel parallel-syncs {master} 1\n",
                    dir = dir.path().display(),
                    log = log.display(),
                    master = Self::MASTER,
                    primary = primary.port(),
                ),
            )?;
            let child = Command::new("redis-server")
                .arg(&config)
                .arg("--sentinel")
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .map_err(|source| HarnessError::Spawn { binary: "redis-server".into(), source })?;
            sentinels.push(SentinelProcess { child: Some(child), port, log });
        }
        let group = Self { primary, replica, replication, sentinels, _dir: dir };
        group.wait_ready()?;
        Ok(group)
    }

    fn wait_ready(&self) -> Result<(), HarnessError> {
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            if self.replica_in_sync() && self.sentinels.iter().all(|s| self.sentinel_sees_all(s)) {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(HarnessError::Timeout { action: "bring up the sentinel group", timeout: READY_TIMEOUT });
            }
            thread::sleep(POLL);
        }
    }

    fn replica_in_sync(&self) -> bool {
        let Ok(mut con) = self.replica.connection() else { return false };
        let info: String = redis::cmd("INFO").arg("replication").query(&mut con).unwrap_or_default();
        info.contains("master_link_status:up")
    }

    /// The sentinel knows the primary, the replica and the two other sentinels.
    fn sentinel_sees_all(&self, sentinel: &SentinelProcess) -> bool {
        let Ok(mut con) = sentinel.client() else { return false };
        let master: redis::RedisResult<Vec<String>> =
            redis::cmd("SENTINEL").arg("MASTER").arg(Self::MASTER).query(&mut con);
        let Ok(fields) = master else { return false };
        let field = |name: &str| fields.iter().position(|f| f == name).and_then(|i| fields.get(i + 1)).cloned();
        field("num-slaves").as_deref() == Some("1") && field("num-other-sentinels").as_deref() == Some("2")
    }

    /// From now on the replica receives nothing more from the primary (the link hangs; neither
    /// side notices for a while): the writes that follow are the ones a failover loses.
    pub fn cut_replication(&self) {
        self.replication.set_fault(Fault::BlackHole);
    }

    /// The primary at start.
    pub fn primary(&mut self) -> &mut RedisServer {
        &mut self.primary
    }

    /// The replica at start (the primary after a failover).
    pub fn replica(&mut self) -> &mut RedisServer {
        &mut self.replica
    }

    /// The sentinels' addresses, `127.0.0.1:{port}`.
    pub fn sentinel_addresses(&self) -> Vec<String> {
        self.sentinels.iter().map(SentinelProcess::address).collect()
    }

    /// The sentinels.
    pub fn sentinels(&mut self) -> &mut [SentinelProcess] {
        &mut self.sentinels
    }

    /// The primary's port as the first sentinel that answers names it.
    pub fn primary_port_named(&self) -> Option<u16> {
        self.sentinels.iter().find_map(|sentinel| {
            let mut con = sentinel.client().ok()?;
            let (_, port): (String, u16) =
                redis::cmd("SENTINEL").arg("GET-MASTER-ADDR-BY-NAME").arg(Self::MASTER).query(&mut con).ok()?;
            Some(port)
        })
    }

    /// Waits until the sentinels name the replica as the primary and it has taken the role.
    ///
    /// # Errors
    ///
    /// [`HarnessError::Timeout`] after `timeout`.
    pub fn wait_failover(&self, timeout: Duration) -> Result<Duration, HarnessError> {
        let started = Instant::now();
        loop {
            if self.primary_port_named() == Some(self.replica.port()) {
                let role = self.replica.connection().ok().and_then(|mut con| {
                    redis::cmd("ROLE").query::<Vec<redis::Value>>(&mut con).ok().and_then(|r| r.into_iter().next())
                });
                if role == Some(redis::Value::BulkString(b"master".to_vec())) {
                    return Ok(started.elapsed());
                }
            }
            if started.elapsed() >= timeout {
                return Err(HarnessError::Timeout { action: "see the sentinels fail over", timeout });
            }
            thread::sleep(POLL);
        }
    }
}
