//! Wake-ups: a pub/sub subscription to a process's wake-up channel.
//!
//! When `finish.lua` frees a permit, it publishes the upstream's name on the channel of the
//! process that has waited longest at the limit (or that the choice of class reaches), and on
//! no other ([`UpstreamKeys::wake_channel`](crate::UpstreamKeys::wake_channel)). Each process
//! subscribes to its own channel, so the one named asks again at once instead of polling.
//! When the release granted the freed permit to that process's last ask in the same step (the
//! hand-off), the message carries the grant ([`WakeMessage`]), and the process needs no
//! acquire of its own.

use redis::aio::PubSub;
use wavegate_core::{PermitId, WaveState};

use crate::connection::Store;
use crate::error::StoreError;

/// A live subscription; yields the channel of each release.
pub struct ReleaseSubscription {
    pubsub: PubSub,
}

impl std::fmt::Debug for ReleaseSubscription {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReleaseSubscription").finish_non_exhaustive()
    }
}

impl ReleaseSubscription {
    /// Connects and subscribes to `channels`, within the connect timeout plus one command
    /// timeout per channel. Behind Sentinel it subscribes on the primary the sentinels name
    /// now; on a Cluster on the first seed that accepts (a plain `PUBLISH` reaches every node).
    pub async fn subscribe<'a>(store: &Store, channels: impl IntoIterator<Item = &'a str>) -> Result<Self, StoreError> {
        const COMMAND: &str = "SUBSCRIBE";
        let channels: Vec<&str> = channels.into_iter().collect();
        let config = store.config();
        let bound = config.connect_timeout + config.command_timeout * u32::try_from(channels.len()).unwrap_or(u32::MAX);
        let timeout_ms = u64::try_from(bound.as_millis()).unwrap_or(u64::MAX);
        let mut last = StoreError::invalid("no server to subscribe on");
        for client in store.subscription_clients(COMMAND).await? {
            let connect = async {
                let mut pubsub = client.get_async_pubsub().await?;
                for channel in &channels {
                    pubsub.subscribe(*channel).await?;
                }
                Ok::<_, redis::RedisError>(pubsub)
            };
            match tokio::time::timeout(bound, connect).await {
                Ok(Ok(pubsub)) => return Ok(Self { pubsub }),
                Ok(Err(error)) => last = StoreError::from_redis(COMMAND, timeout_ms, error),
                Err(_) => last = StoreError::Timeout { command: COMMAND, timeout_ms },
            }
        }
        Err(last)
    }

    /// The channel and the message (the upstream to ask again for) of the next wake-up, or
    /// `None` when the connection is gone.
    pub async fn next(&mut self) -> Option<(String, String)> {
        use futures_util::StreamExt;
        let message = self.pubsub.on_message().next().await?;
        let payload: String = message.get_payload().unwrap_or_default();
        Some((message.get_channel_name().to_owned(), payload))
    }
}

/// A permit a release granted to the process it woke (the hand-off): held in the store from the
/// release on, under the id of that process's last ask at the limit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HandedPermit {
    /// The permit's id (the ask's).
    pub id: PermitId,
    /// The wave it was granted in.
    pub wave: u64,
    /// The wave's state then.
    pub state: WaveState,
    /// The limit then.
    pub limit: u32,
}

/// A message on a wake-up channel: the upstream to ask again for, and the permit handed with
/// it, if any (`'<upstream>'`, or `'<upstream> <wave> <state> <limit> <id>'`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WakeMessage {
    /// The upstream's name.
    pub upstream: String,
    /// The permit handed to this process, if the release granted one.
    pub handed: Option<HandedPermit>,
}

impl WakeMessage {
    /// Reads a message. A grant that does not read back (another version's message, a hand
    /// edit) is a wake-up without one: the process asks, and an id already held is granted
    /// again, not twice.
    pub fn parse(payload: &str) -> Self {
        let mut fields = payload.splitn(5, ' ');
        let upstream = fields.next().unwrap_or_default().to_owned();
        let handed = (|| {
            let wave = fields.next()?.parse().ok()?;
            let state = WaveState::parse(fields.next()?)?;
            let limit = fields.next()?.parse().ok()?;
            let id = PermitId::parse(fields.next()?).ok()?;
            Some(HandedPermit { id, wave, state, limit })
        })();
        Self { upstream, handed }
    }
}
