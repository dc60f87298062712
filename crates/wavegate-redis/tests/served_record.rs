//! Shadow mode's record of the fleet's calls at the provider, full: a 429 whose neighbours the
//! record may have dropped teaches nothing, in both twins (the calls that ended first go first,
//! and a call beside the 429 that went would make it look within the limit).

use wavegate_core::{LocalGate, RateLimitEffect, SERVED_SPANS_MAX, ServedSpan, UpstreamConfig, WaveSignal};
use wavegate_redis::{SharedGate, Store, StoreConfig, store_now_ms};
use wavegate_testkit::RedisServer;

/// A release's id and signal.
type Finish = (String, WaveSignal);

/// The records, then the two 429s judged: one beside four served calls the record dropped
/// since, then one alone after the first call the record kept.
fn signals(now: u64) -> (Vec<Finish>, [Finish; 2]) {
    let at = |went_ms: u64, ended_ms: u64| ServedSpan { went_ms, ended_ms };
    let refused = now - 10_000;
    // Four served beside the 429 (limit 4: five at once, not the limit's), then enough calls
    // of 10 ms, each after the last, to push them out.
    let mut records: Vec<Finish> = (0..4)
        .map(|i| (format!("beside-{i}"), WaveSignal::Went { span: at(refused - 50, refused + 50), served: true }))
        .collect();
    for i in 0..SERVED_SPANS_MAX as u64 {
        let went = refused + 100 + i * 10;
        records.push((format!("after-{i}"), WaveSignal::Went { span: at(went, went + 10), served: true }));
    }
    let alone = refused + 100 + SERVED_SPANS_MAX as u64 * 10 + 500;
    let judged = [
        ("x".to_owned(), WaveSignal::RateLimitedAmong { retry_after: None, span: at(refused, refused) }),
        ("y".to_owned(), WaveSignal::RateLimitedAmong { retry_after: None, span: at(alone, alone) }),
    ];
    (records, judged)
}

#[tokio::test]
async fn a_429_the_full_record_no_longer_covers_teaches_nothing_in_both_twins() {
    let config = UpstreamConfig::builder("full").limit(4).build().expect("valid");
    let now = store_now_ms();
    let (records, [beside, alone]) = signals(now);

    // Rust twin.
    let mut local = LocalGate::for_upstream(&config);
    for (id, signal) in &records {
        local.finish_text(id, 1, *signal, now);
    }
    assert_eq!(local.finish_text(&beside.0, 1, beside.1, now).rate_limit, None, "Rust: its neighbours may be gone");
    let cut = local.finish_text(&alone.0, 1, alone.1, now).rate_limit;
    assert!(matches!(cut, Some(RateLimitEffect::Cut { .. })), "Rust: alone, the limit's: {cut:?}");

    // Lua twin.
    let server = RedisServer::start().expect("redis-server");
    let store = Store::connect(StoreConfig::new(server.url())).await.expect("store");
    let shared = SharedGate::for_upstream(store, &config);
    for (id, signal) in &records {
        shared.finish_text(id, 1, *signal, 0).await.expect("record");
    }
    let judged = shared.finish_text(&beside.0, 1, beside.1, 0).await.expect("finish");
    assert_eq!(judged.rate_limit, None, "Lua: its neighbours may be gone");
    let cut = shared.finish_text(&alone.0, 1, alone.1, 0).await.expect("finish").rate_limit;
    assert!(matches!(cut, Some(RateLimitEffect::Cut { .. })), "Lua: alone, the limit's: {cut:?}");
}
