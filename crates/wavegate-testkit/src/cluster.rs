//! A Redis Cluster of masters on loopback.
//!
//! [`RedisCluster::start`] starts `n` [`RedisServer`]s with `--cluster-enabled yes`, joins them
//! with `redis-cli --cluster create` (no replicas: the slots are split evenly) and waits until
//! every node reports `cluster_state:ok`. Each node can be killed or restarted like any
//! [`RedisServer`]; `cluster-require-full-coverage no`, so the other masters go on serving their
//! slots while one is down. Dropping the cluster kills every node.

use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use crate::{HarnessError, RedisServer};

const READY_TIMEOUT: Duration = Duration::from_secs(20);
const POLL: Duration = Duration::from_millis(50);

/// A cluster of masters; every node is killed on drop.
#[derive(Debug)]
pub struct RedisCluster {
    nodes: Vec<RedisServer>,
}

impl RedisCluster {
    /// Starts `masters` nodes (at least 3, as `redis-cli --cluster create` wants) and joins
    /// them into one cluster.
    ///
    /// # Errors
    ///
    /// As for [`RedisServer::start`]; [`HarnessError::Io`] if `redis-cli` fails;
    /// [`HarnessError::Timeout`] if the cluster is not `ok` within 20 s.
    pub fn start(masters: usize) -> Result<Self, HarnessError> {
        let mut nodes = Vec::with_capacity(masters);
        for _ in 0..masters {
            nodes.push(
                RedisServer::builder()
                    .extra_arg("--cluster-enabled")
                    .extra_arg("yes")
                    .extra_arg("--cluster-config-file")
                    .extra_arg("nodes.conf")
                    .extra_arg("--cluster-node-timeout")
                    .extra_arg("1000")
                    .extra_arg("--cluster-require-full-coverage")
                    .extra_arg("no")
                    .start()?,
            );
        }
        let addresses: Vec<String> = nodes.iter().map(|n| n.addr().to_string()).collect();
        let output = Command::new("redis-cli")
            .arg("--cluster")
            .arg("create")
            .args(&addresses)
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .stdin(Stdio::null())
            .output()
            .map_err(|source| HarnessError::Spawn { binary: "redis-cli".into(), source })?;
        if !output.status.success() {
            let text = String::from_utf8_lossy(&output.stdout).into_owned() + &String::from_utf8_lossy(&output.stderr);
            return Err(HarnessError::Io(std::io::Error::other(format!("redis-cli --cluster create failed: {text}"))));
        }
        let cluster = Self { nodes };
        cluster.wait_ok()?;
        Ok(cluster)
    }

    fn wait_ok(&self) -> Result<(), HarnessError> {
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            let ok = self.nodes.iter().all(|node| {
                node.connection()
                    .and_then(|mut con| Ok(redis::cmd("CLUSTER").arg("INFO").query::<String>(&mut con)?))
                    .is_ok_and(|info| info.contains("cluster_state:ok"))
            });
            if ok {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(HarnessError::Timeout { action: "see the cluster ok", timeout: READY_TIMEOUT });
            }
            thread::sleep(POLL);
        }
    }

    /// The nodes' URLs, `redis://127.0.0.1:{port}/` (seeds for a cluster client).
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    /// The nodes.
    pub fn nodes(&mut self) -> &mut [RedisServer] {
        &mut self.nodes
    }

    /// The index of the node that serves `key`'s slot (as the first node that answers says).
    ///
    /// # Errors
    ///
    /// If no node answers `CLUSTER KEYSLOT` and `CLUSTER SLOTS`.
    pub fn node_of(&self, key: &str) -> Result<usize, HarnessError> {
        let mut last = None;
        for node in &self.nodes {
            let answer = node.connection().and_then(|mut con| {
                let slot: i64 = redis::cmd("CLUSTER").arg("KEYSLOT").arg(key).query(&mut con)?;
                let slots: Vec<Vec<redis::Value>> = redis::cmd("CLUSTER").arg("SLOTS").query(&mut con)?;
                let int = |v: &redis::Value| if let redis::Value::Int(n) = v { Some(*n) } else { None };
                let port = slots.iter().find_map(|range| {
                    let (from, to) = (int(range.first()?)?, int(range.get(1)?)?);
                    let redis::Value::Array(master) = range.get(2)? else { return None };
                    (from..=to).contains(&slot).then(|| int(master.get(1)?)).flatten()
                });
                let port = port.and_then(|p| u16::try_from(p).ok());
                Ok(port.and_then(|port| self.nodes.iter().position(|n| n.port() == port)))
            });
            match answer {
                Ok(Some(index)) => return Ok(index),
                Ok(None) => last = Some(HarnessError::Io(std::io::Error::other(format!("no node serves {key}")))),
                Err(error) => last = Some(error),
            }
        }
        Err(last.unwrap_or(HarnessError::NotRunning))
    }
}
