//! Wake-ups and live changes from other processes: a subscriber to this process's own wake-up
//! channel and to the fleet's channel of live changes.
//!
//! A release anywhere in the fleet that frees a permit for a process waiting at the limit
//! publishes the upstream's name on that process's channel only (`finish.lua`), so each release
//! is delivered once, whatever the size of the fleet; the listener turns it into a [`Wake`] for
//! the upstream's lane, which asks again at once instead of polling (or, when the release
//! handed it the permit, takes the grant the message carries). A live change publishes
//! the upstream's name on the changes channel (`live.lua`), which every process hears; the
//! lane looks at the live settings at once ([`CheckLive`]). The listener resubscribes with
//! backoff when the server goes away, and ends when the coordinator stops. Polling remains as a
//! safety net (at the limit, and the live settings' look: every 10 s without a subscription,
//! every 60 s with one), so a lost message costs latency only.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use actix::WeakAddr;
use wavegate_redis::{ReleaseSubscription, Store, WakeMessage};

use crate::engine::lane::{CheckLive, Lane};
use crate::engine::wake::{Handed, HandedBy, Wake};

const RESUBSCRIBE_MIN: Duration = Duration::from_millis(100);
const RESUBSCRIBE_MAX: Duration = Duration::from_secs(2);

/// Listens on `wake` (this process's wake-up channel) and `changes` (the fleet's live changes)
/// for the names of the upstreams in `lanes`, until every lane has stopped (it holds them
/// weakly, so it keeps none alive).
/// `hears` says, while the subscription is made, that the changes are heard (the lanes' looks
/// without an announcement can then be rare).
pub(super) fn spawn_listener(
    store: Store,
    (wake, changes): (String, String),
    lanes: Vec<(String, WeakAddr<Lane>)>,
    hears: Arc<AtomicBool>,
) {
    if lanes.is_empty() {
        return;
    }
    actix::spawn(async move {
        let routes: HashMap<String, WeakAddr<Lane>> = lanes.into_iter().collect();
        let connected = || routes.values().any(|lane| lane.upgrade().is_some());
        let mut backoff = RESUBSCRIBE_MIN;
        while connected() {
            match ReleaseSubscription::subscribe(&store, [wake.as_str(), changes.as_str()]).await {
                Ok(mut subscription) => {
                    backoff = RESUBSCRIBE_MIN;
                    hears.store(true, Ordering::Relaxed);
                    // A change announced while there was no subscription was not heard: look.
                    for lane in routes.values().filter_map(WeakAddr::upgrade) {
                        lane.do_send(CheckLive);
                    }
                    while let Some((channel, payload)) = subscription.next().await {
                        if !connected() {
                            return;
                        }
                        let message = WakeMessage::parse(&payload);
                        let Some(lane) = routes.get(&message.upstream).and_then(WeakAddr::upgrade) else { continue };
                        if channel == wake {
                            let handed = message.handed.map(|h| Handed {
                                id: h.id,
                                wave: h.wave,
                                state: h.state,
                                limit: h.limit,
                                by: HandedBy::Store,
                            });
                            lane.do_send(Wake { handed });
                        } else {
                            lane.do_send(CheckLive);
                        }
                    }
                    hears.store(false, Ordering::Relaxed);
                    tracing::debug!("wake-up subscription closed; resubscribing");
                }
                Err(error) => tracing::debug!(%error, "could not subscribe to the wake-up channels"),
            }
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(RESUBSCRIBE_MAX);
        }
    });
}
