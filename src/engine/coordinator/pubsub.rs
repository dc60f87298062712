//! Wake-ups from other processes: a subscriber to every upstream's release channel.
//!
//! A release anywhere in the fleet is announced on the upstream's channel, naming the process
//! that has waited longest at the limit; when that is this process, the listener turns it into
//! a [`Wake`] for the upstream's lane, which asks again at once instead of polling. A live
//! change is announced there too: the lane looks at the live settings at once ([`CheckLive`]). The
//! listener resubscribes with backoff when the server goes away, and ends when the coordinator
//! stops. Polling at the limit remains as a safety net, so a lost message costs latency only.

use std::collections::HashMap;
use std::time::Duration;

use actix::WeakAddr;
use wavegate_redis::{ReleaseSubscription, Store};

use crate::engine::lane::{CheckLive, Lane};
use crate::engine::store;
use crate::engine::wake::Wake;

const RESUBSCRIBE_MIN: Duration = Duration::from_millis(100);
const RESUBSCRIBE_MAX: Duration = Duration::from_secs(2);

/// Listens on `channels` (each a lane's release channel) for wake-ups naming `instance`,
/// until every lane has stopped (it holds them weakly, so it keeps none alive).
pub(super) fn spawn_listener(store: Store, instance: String, channels: Vec<(String, WeakAddr<Lane>)>) {
    if channels.is_empty() {
        return;
    }
    actix::spawn(async move {
        let routes: HashMap<String, WeakAddr<Lane>> = channels.into_iter().collect();
        let connected = || routes.values().any(|lane| lane.upgrade().is_some());
        let mut backoff = RESUBSCRIBE_MIN;
        while connected() {
            match ReleaseSubscription::subscribe(&store, routes.keys().map(String::as_str)).await {
                Ok(mut subscription) => {
                    backoff = RESUBSCRIBE_MIN;
                    while let Some((channel, wake)) = subscription.next().await {
                        if !connected() {
                            return;
                        }
                        let Some(lane) = routes.get(&channel).and_then(WeakAddr::upgrade) else { continue };
                        if wake == instance {
                            lane.do_send(Wake);
                        } else if store::is_live_nudge(&wake) {
                            lane.do_send(CheckLive);
                        }
                    }
                    tracing::debug!("release subscription closed; resubscribing");
                }
                Err(error) => tracing::debug!(%error, "could not subscribe to the release channels"),
            }
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(RESUBSCRIBE_MAX);
        }
    });
}
