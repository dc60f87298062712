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
