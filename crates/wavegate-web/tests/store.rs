//! The shared store in the status (feature `redis`), against a `redis-server` the test starts.

use wavegate::{Scheduler, UpstreamConfig};

#[tokio::test]
async fn the_status_endpoint_shows_the_shared_store() {
    let redis = wavegate_testkit::RedisServer::start().expect("redis-server");
    let upstream = UpstreamConfig::builder("llm").limit(2).build().expect("config");
    let scheduler =
        Scheduler::builder().upstream(upstream).redis(redis.url()).key_prefix("billing").build().expect("scheduler");
    let status = wavegate_web::status(&scheduler).await.expect("status");
    let body = serde_json::to_value(&status.store).expect("JSON");
    assert_eq!(body["topology"], "single");
    assert_eq!(body["key_prefix"], "billing");
    assert!(body["server"].as_str().is_some_and(|s| s.starts_with("redis ")), "{body}");
    assert!(body.get("rejected").is_none(), "{body}");
    let upstream = serde_json::to_value(&status.upstreams[0]).expect("JSON");
    assert_eq!(upstream["mode"], "shared");
    assert!(upstream.get("warning").is_none(), "the store is shown, nothing to warn about: {upstream}");
    let local = Scheduler::builder().upstream(UpstreamConfig::builder("llm").build().expect("config")).build();
    let local = wavegate_web::status(&local.expect("scheduler")).await.expect("status");
    assert!(local.store.is_none());
}

/// A fleet of four processes (four schedulers, each its own instance in the store) on one
/// upstream: the history of one of them shows the four, the fleet's permits as the store's
/// last reply said, its 429 and the wave it started, in shared mode.
#[tokio::test]
async fn the_history_shows_the_fleet_as_the_store_last_said() {
    use std::time::{Duration, Instant, SystemTime};

    let redis = wavegate_testkit::RedisServer::start().expect("redis-server");
    let process = || {
        let upstream = UpstreamConfig::builder("llm").limit(8).build().expect("config");
        Scheduler::builder().upstream(upstream).redis(redis.url()).key_prefix("fleet-page").build().expect("scheduler")
    };
    let (watched, others) = (process(), [process(), process(), process()]);
    let mut held = Vec::new();
    for other in &others {
        held.push(other.upstream("llm").unwrap().request().acquire().await.expect("a permit"));
    }
    // A release of the watched process: the store's reply counts the three others' permits.
    let llm = watched.upstream("llm").unwrap();
    llm.request().acquire().await.expect("a permit").report(wavegate::Outcome::from_status(
        200,
        None,
        SystemTime::now(),
    ));
    llm.request().acquire().await.expect("a permit").report(wavegate::Outcome::from_status(
        429,
        Some("5"),
        SystemTime::now(),
    ));
    let deadline = Instant::now() + Duration::from_secs(10);
    let body = loop {
        let body = serde_json::to_value(wavegate_web::history(&watched).await.expect("history")).expect("JSON");
        let samples = &body["upstreams"][0]["samples"];
        let rate_limited: u64 = samples["rate_limited"].as_array().unwrap().iter().filter_map(|v| v.as_u64()).sum();
        if body["processes"] == 4
            && samples["in_flight_fleet"].as_array().unwrap().last() == Some(&3.into())
            && rate_limited == 1
        {
            break body;
        }
        assert!(Instant::now() < deadline, "the history never showed the fleet: {body:#}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let llm = &body["upstreams"][0];
    assert_eq!(llm["mode"], "shared");
    // The store's reply to the 429: a step back or a cooldown, at a lower limit.
    assert_ne!(llm["state"], "NORMAL", "{llm:#}");
    assert!(llm["changes"].as_array().is_some_and(|c| c.len() >= 2), "{llm:#}");
    assert!(llm["samples"]["limit"].as_array().unwrap().last().and_then(|v| v.as_u64()).is_some_and(|l| l < 8));
    drop(held);
}
