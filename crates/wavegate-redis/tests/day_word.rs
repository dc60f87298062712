//! What the store says is left of the day is the word a fallback's day shares start from, less
//! this process's use since it: a reply that was on its way when the store stopped answering,
//! and comes back during the fallback, was run before the store heard of the fallback's grants
//! and must not become that word (it did, and a flapping store then handed 9 requests out of a
//! day of 8: `tests/day_budgets.rs`, `a_flapping_store_hands_out_no_fresh_day`, under load).

use std::time::Duration;

use wavegate_core::{DayLeft, UpstreamConfig};
use wavegate_redis::{SharedGate, Store, StoreConfig};
use wavegate_testkit::RedisServer;

const LEASE: Duration = Duration::from_secs(30);

fn requests_left(shared: &SharedGate) -> Option<u64> {
    shared.day_left().and_then(|(left, _)| left.requests)
}

#[tokio::test]
async fn a_reply_that_comes_back_during_a_fallback_is_not_the_days_word() {
    let config = UpstreamConfig::builder("rpd").limit(10).requests_per_day(8, 8).build().expect("valid");
    let mut server = RedisServer::start().expect("redis-server");
    let mut store_config = StoreConfig::new(server.url());
    store_config.command_timeout = Duration::from_secs(10);
    let store = Store::connect(store_config).await.expect("store");
    let shared = SharedGate::for_upstream(store, &config);
    shared.acquire_text("a", LEASE, 0).await.expect("acquire");
    assert_eq!(requests_left(&shared), Some(7));

    // The store stops; an acquire is on its way; the process falls back; the store comes back
    // and runs it.
    server.pause().expect("SIGSTOP");
    let on_its_way = tokio::spawn({
        let shared = shared.clone();
        async move { shared.acquire_text("b", LEASE, 0).await }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    shared.hold_day_word();
    server.resume().expect("SIGCONT");
    on_its_way.await.expect("joined").expect("the store ran it");
    assert_eq!(requests_left(&shared), Some(7), "a reply run before the store heard the fallback became the word");

    // Shared again (the store heard the fallback): a late reply of a request sent before says
    // nothing, a new one says the day.
    shared.release_day_word();
    shared.acquire_text("c", LEASE, 0).await.expect("acquire");
    assert_eq!(shared.day_left().map(|(left, _)| left), Some(DayLeft { requests: Some(5), tokens: None }));
}
