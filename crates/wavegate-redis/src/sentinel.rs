//! Finding the primary through Redis Sentinel.
//!
//! Every sentinel is asked at once (`SENTINEL GET-MASTER-ADDR-BY-NAME`), each within the
//! connect timeout plus one command timeout, and the first that names a primary wins: a dead
//! or hung sentinel delays nothing (asked in turn, a hung one would cost every question its
//! whole bound, more than the command that needs the answer may take). The connection to the
//! primary is then made as for a single server (with the URL's credentials, database and
//! scheme).
//!
//! A sentinel that names a server which is no longer the primary (it has not noticed a
//! failover yet) makes the writes fail with `READONLY` or a refused connection: an outage,
//! after which the sentinels are asked again.

use std::time::Duration;

use crate::connection::StoreConfig;
use crate::error::{Rejection, StoreError};

/// A primary found through Sentinel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SentinelConfig {
    /// The name the sentinels monitor the primary under (`sentinel monitor <name> …`).
    pub master: String,
    /// The sentinels, as `host:port` or `redis://host:port` (plain TCP, no password).
    pub sentinels: Vec<String>,
}

impl SentinelConfig {
    pub(crate) fn validate(&self) -> Result<(), StoreError> {
        if self.master.is_empty() {
            return Err(StoreError::invalid("the Sentinel master name is empty"));
        }
        if self.sentinels.is_empty() {
            return Err(StoreError::invalid("no Sentinel address given"));
        }
        for address in &self.sentinels {
            sentinel_client(address)?;
        }
        Ok(())
    }
}

fn sentinel_client(address: &str) -> Result<redis::Client, StoreError> {
    let url = if address.contains("://") { address.to_owned() } else { format!("redis://{address}") };
    redis::Client::open(url).map_err(|source| StoreError::Refused { command: "sentinel", source })
}

/// The primary's host and port, from the first sentinel that names one.
pub(crate) async fn find_primary(
    sentinel: &SentinelConfig,
    config: &StoreConfig,
    command: &'static str,
) -> Result<(String, u16), StoreError> {
    use futures_util::StreamExt;
    let bound = config.connect_timeout + config.command_timeout;
    let timeout_ms = u64::try_from(bound.as_millis()).unwrap_or(u64::MAX);
    let mut questions = futures_util::stream::FuturesUnordered::new();
    for address in &sentinel.sentinels {
        let client = sentinel_client(address)?;
        let master = sentinel.master.as_str();
        questions.push(async move {
            let answer = tokio::time::timeout(bound, ask(client, master, config.connect_timeout)).await;
            (address, answer)
        });
    }
    let (mut unknown, mut last) = (None, None);
    while let Some((address, answer)) = questions.next().await {
        match answer {
            Ok(Ok(Some(primary))) => return Ok(primary),
            Ok(Ok(None)) => {
                unknown = Some(StoreError::Rejected {
                    command,
                    reason: Rejection::Sentinel,
                    detail: format!("sentinel {address} knows no master named {:?}", sentinel.master),
                });
            }
            Ok(Err(error)) => last = Some(StoreError::from_redis(command, timeout_ms, error)),
            Err(_) => last = Some(StoreError::Timeout { command, timeout_ms }),
        }
    }
    // No sentinel named a primary: one that does not know the name is a rejection (a wrong
    // name); all down or hung is an outage.
    Err(unknown.or(last).unwrap_or_else(|| StoreError::invalid("no Sentinel address given")))
}

async fn ask(client: redis::Client, master: &str, connect: Duration) -> redis::RedisResult<Option<(String, u16)>> {
    let config = redis::AsyncConnectionConfig::new().set_connection_timeout(Some(connect));
    let mut connection = client.get_multiplexed_async_connection_with_config(&config).await?;
    let reply: Option<(String, u16)> =
        redis::cmd("SENTINEL").arg("GET-MASTER-ADDR-BY-NAME").arg(master).query_async(&mut connection).await?;
    Ok(reply)
}

/// Whether the server at `client` says it is a primary (`ROLE`): a sentinel's answer can be
/// stale during a failover (it names the old primary, now a replica), so the answer is checked
/// before wavegate's scripts are sent there. A replica is an outage for now (the sentinels will
/// name the new primary); a check that cannot run is left to the connection to report.
pub(crate) async fn confirm_primary(
    client: &redis::Client,
    config: &StoreConfig,
    command: &'static str,
) -> Result<(), StoreError> {
    let bound = config.connect_timeout + config.command_timeout;
    let timeout_ms = u64::try_from(bound.as_millis()).unwrap_or(u64::MAX);
    let ask = async {
        let connect = redis::AsyncConnectionConfig::new().set_connection_timeout(Some(config.connect_timeout));
        let mut connection = client.get_multiplexed_async_connection_with_config(&connect).await?;
        let role: Vec<redis::Value> = redis::cmd("ROLE").query_async(&mut connection).await?;
        Ok::<_, redis::RedisError>(role)
    };
    let role = match tokio::time::timeout(bound, ask).await {
        Ok(Ok(role)) => role,
        Ok(Err(error)) => return Err(StoreError::from_redis(command, timeout_ms, error)),
        Err(_) => return Err(StoreError::Timeout { command, timeout_ms }),
    };
    let name = role.first().and_then(|value| redis::from_redis_value_ref::<String>(value).ok());
    if name.as_deref() == Some("master") {
        return Ok(());
    }
    let detail = format!("the server the sentinels named answers ROLE {name:?}, not a primary (a failover under way)");
    let source =
        redis::RedisError::from((redis::ErrorKind::Server(redis::ServerErrorKind::ReadOnly), "not a primary", detail));
    Err(StoreError::Unavailable { command, source })
}
