//! Counting what the fleet asked of Redis, from `INFO commandstats`.
//!
//! Redis counts a command run inside a Lua script under its own name too (`cmdstat_zadd`
//! for a `redis.call('ZADD', ..)`), so two numbers come out: the commands **sent** by
//! clients (round trips: `EVALSHA`, `PING`, `SUBSCRIBE`, ...) and every command
//! **executed** (those plus the ones inside the scripts). The runner's own commands
//! (`CONFIG`, `INFO`, `ZRANGE`) are left out, and so are the status poller's reads (one
//! `EVALSHA` each, plus what the status script runs, measured by [`status_cost`]).

use std::collections::BTreeMap;
use std::time::Duration;

use wavegate_redis::{SharedGate, Store, StoreConfig};

/// Calls per command name, as `INFO commandstats` reports them.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct CommandStats {
    pub(crate) calls: BTreeMap<String, u64>,
    /// The time Redis spent in each command (µs): an `EVALSHA`'s is the whole script's, the
    /// commands it runs included.
    pub(crate) usec: BTreeMap<String, u64>,
}

/// Commands only a client sends (never a script).
const CLIENT_COMMANDS: &[&str] = &[
    "evalsha",
    "eval",
    "evalsha_ro",
    "eval_ro",
    "fcall",
    "fcall_ro",
    "script",
    "ping",
    "subscribe",
    "unsubscribe",
    "psubscribe",
    "punsubscribe",
    "ssubscribe",
    "sunsubscribe",
    "hello",
    "client",
    "select",
    "auth",
    "command",
    "multi",
    "exec",
    "readonly",
    "cluster",
    "asking",
];
/// Commands the runner sends itself.
const RUNNER_COMMANDS: &[&str] = &["config", "info", "zrange"];

impl CommandStats {
    /// Parses the text of `INFO commandstats`.
    pub(crate) fn parse(info: &str) -> Self {
        let mut calls = BTreeMap::new();
        let mut usec = BTreeMap::new();
        for line in info.lines() {
            let Some(rest) = line.strip_prefix("cmdstat_") else { continue };
            let Some((name, stats)) = rest.split_once(':') else { continue };
            let field = |key: &str| {
                stats.split(',').find_map(|kv| kv.strip_prefix(key)).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0)
            };
            *calls.entry(name.to_string()).or_default() += field("calls=");
            *usec.entry(name.to_string()).or_default() += field("usec=");
        }
        Self { calls, usec }
    }

    /// Reads the stats of the server at `url`.
    pub(crate) fn read(con: &mut redis::Connection) -> redis::RedisResult<Self> {
        let info: String = redis::cmd("INFO").arg("commandstats").query(con)?;
        Ok(Self::parse(&info))
    }

    /// Adds another snapshot (e.g. from before a restart, which zeroes the counters).
    pub(crate) fn add(&mut self, other: &CommandStats) {
        for (name, count) in &other.calls {
            *self.calls.entry(name.clone()).or_default() += count;
        }
        for (name, usec) in &other.usec {
            *self.usec.entry(name.clone()).or_default() += usec;
        }
    }

    fn base(name: &str) -> &str {
        name.split('|').next().unwrap_or(name)
    }

    /// Commands sent by the clients (the fleet), the runner's left out.
    pub(crate) fn sent(&self) -> u64 {
        self.calls.iter().filter(|(n, _)| CLIENT_COMMANDS.contains(&Self::base(n))).map(|(_, c)| c).sum()
    }

    /// Per script call (`EVALSHA`): Redis's time in it and in the commands that scripts run
    /// (every command but the clients' and the runner's own, µs); the difference is the Lua
    /// itself. `None` without script calls.
    pub(crate) fn script_time(&self) -> Option<(f64, f64)> {
        let scripts = *self.calls.get("evalsha").filter(|n| **n > 0)? as f64;
        let inside: u64 = self
            .usec
            .iter()
            .filter(|(n, _)| !CLIENT_COMMANDS.contains(&Self::base(n)) && !RUNNER_COMMANDS.contains(&Self::base(n)))
            .map(|(_, u)| u)
            .sum();
        let total = self.usec.get("evalsha").copied().unwrap_or(0) as f64;
        Some((total / scripts, inside as f64 / scripts))
    }

    /// Every command executed, those inside scripts included, the runner's left out.
    pub(crate) fn executed(&self) -> u64 {
        self.calls.iter().filter(|(n, _)| !RUNNER_COMMANDS.contains(&Self::base(n))).map(|(_, c)| c).sum()
    }
}

/// What one status read costs: (commands sent, commands executed). Measured on the server at
/// `url` with the wave configuration `limit`, by a few reads between two snapshots.
pub(crate) fn status_cost(url: &str, limit: u32) -> Result<(f64, f64), String> {
    const READS: u32 = 20;
    let config =
        wavegate::UpstreamConfig::builder(crate::worker::UPSTREAM).limit(limit).build().map_err(|e| e.to_string())?;
    let client = redis::Client::open(url).map_err(|e| e.to_string())?;
    let mut con = client.get_connection_with_timeout(Duration::from_secs(2)).map_err(|e| e.to_string())?;
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| e.to_string())?;
    runtime.block_on(async {
        let store = Store::connect(StoreConfig::new(url)).await.map_err(|e| e.to_string())?;
        let gate = SharedGate::new(store, config.name(), config.wave());
        gate.status().await.map_err(|e| e.to_string())?;
        redis::cmd("CONFIG").arg("RESETSTAT").exec(&mut con).map_err(|e| e.to_string())?;
        for _ in 0..READS {
            gate.status().await.map_err(|e| e.to_string())?;
        }
        let stats = CommandStats::read(&mut con).map_err(|e| e.to_string())?;
        Ok((stats.sent() as f64 / f64::from(READS), stats.executed() as f64 / f64::from(READS)))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sent_and_executed_are_told_apart() {
        let info = "# Commandstats\r\n\
            cmdstat_evalsha:calls=10,usec=500,usec_per_call=50.0,rejected_calls=0,failed_calls=0\r\n\
            cmdstat_zadd:calls=7,usec=40\r\n\
            cmdstat_time:calls=10,usec=1\r\n\
            cmdstat_config|resetstat:calls=1,usec=1\r\n\
            cmdstat_client|setinfo:calls=2,usec=1\r\n\
            cmdstat_info:calls=3,usec=1\r\n";
        let stats = CommandStats::parse(info);
        assert_eq!(stats.sent(), 12);
        assert_eq!(stats.executed(), 29);
        // 50 µs per script, 4 + 0.1 of them in the ZADDs and TIMEs it ran.
        assert_eq!(stats.script_time(), Some((50.0, 4.1)));
        let mut twice = stats.clone();
        twice.add(&stats);
        assert_eq!(twice.sent(), 24);
    }
}
