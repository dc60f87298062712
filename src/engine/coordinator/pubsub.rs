//! Wake-ups from other processes: a subscriber to this process's own wake-up channel.
//!
//! A release anywhere in the fleet that frees a permit for a process waiting at the limit
//! publishes the upstream's name on that process's channel only (`finish.lua`), so each release
//! is delivered once, whatever the size of the fleet. The listener turns it into a [`Wake`]
//! for the upstream's lane, which asks again at once instead of polling. It resubscribes with
//! backoff when the server goes away, and ends when the coordinator stops. Polling at the limit
//! remains as a safety net, so a lost message costs latency only.

use std::collections::HashMap;
use std::time::Duration;

use actix::WeakAddr;
use wavegate_redis::{ReleaseSubscription, Store};

use crate::engine::lane::Lane;
use crate::engine::wake::Wake;

const RESUBSCRIBE_MIN: Duration = Duration::from_millis(100);
const RESUBSCRIBE_MAX: Duration = Duration::from_secs(2);

/// Listens on `channel` (this process's wake-up channel) for the names of the upstreams in
/// `lanes` to wake, until every lane has stopped (it holds them weakly, so it keeps none alive).
pub(super) fn spawn_listener(store: Store, channel: String, lanes: Vec<(String, WeakAddr<Lane>)>) {
    if lanes.is_empty() {
        return;
    }
    actix::spawn(async move {
        let routes: HashMap<String, WeakAddr<Lane>> = lanes.into_iter().collect();
        let connected = || routes.values().any(|lane| lane.upgrade().is_some());
        let mut backoff = RESUBSCRIBE_MIN;
        while connected() {
            match ReleaseSubscription::subscribe(&store, [channel.as_str()]).await {
                Ok(mut subscription) => {
                    backoff = RESUBSCRIBE_MIN;
                    while let Some((_, upstream)) = subscription.next().await {
                        if !connected() {
                            return;
                        }
                        if let Some(lane) = routes.get(&upstream).and_then(WeakAddr::upgrade) {
                            lane.do_send(Wake);
                        }
                    }
                    tracing::debug!("wake-up subscription closed; resubscribing");
                }
                Err(error) => tracing::debug!(%error, "could not subscribe to the wake-up channel"),
            }
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(RESUBSCRIBE_MAX);
        }
    });
}
