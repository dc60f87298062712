//! Wake-ups from other processes: a subscriber to every upstream's release channel.
//!
//! A release anywhere in the fleet is announced on the upstream's channel, naming the process
//! that has waited longest at the limit; when that is this process, the listener turns it into
//! a [`Wake`] for the coordinator, which asks again at once instead of polling. The
//! listener resubscribes with backoff when the server goes away, and ends when the coordinator
//! stops. Polling at the limit remains as a safety net, so a lost message costs latency only.

use std::collections::HashMap;
use std::time::Duration;

use actix::Addr;
use wavegate_redis::{ReleaseSubscription, Store};

use super::Coordinator;
use crate::messages::Wake;

const RESUBSCRIBE_MIN: Duration = Duration::from_millis(100);
const RESUBSCRIBE_MAX: Duration = Duration::from_secs(2);

pub(super) fn spawn_listener(
    store: Store,
    instance: String,
    channels: Vec<(String, usize)>,
    coordinator: Addr<Coordinator>,
) {
    if channels.is_empty() {
        return;
    }
    actix::spawn(async move {
        let routes: HashMap<String, usize> = channels.into_iter().collect();
        let mut backoff = RESUBSCRIBE_MIN;
        while coordinator.connected() {
            match ReleaseSubscription::subscribe(&store, routes.keys().map(String::as_str)).await {
                Ok(mut subscription) => {
                    backoff = RESUBSCRIBE_MIN;
                    while let Some((channel, wake)) = subscription.next().await {
                        if !coordinator.connected() {
                            return;
                        }
                        if let Some(&upstream) = routes.get(&channel).filter(|_| wake == instance) {
                            coordinator.do_send(Wake { upstream });
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
