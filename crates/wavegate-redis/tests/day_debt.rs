//! A day budget's debt (a usage settled above its reservation) is kept alike by the Lua twin
//! and the Rust one: the scripts once clamped every budget's debt to a minute, forgetting most
//! of a day's.

use std::time::Duration;

use wavegate_core::{Admission, Ask, DayLeft, Instance, LocalGate, OutageUsage, PermitId, UpstreamConfig, WaveSignal};
use wavegate_redis::{SharedGate, Store, StoreConfig};
use wavegate_testkit::RedisServer;

const LEASE: Duration = Duration::from_secs(30);

fn config() -> UpstreamConfig {
    // 1,000 tokens a day (one per 86.4 s), the whole day at once.
    UpstreamConfig::builder("tpd").limit(10).tokens_per_day(1_000, 1_000).build().expect("valid")
}

/// A call reserved 100 tokens and used 1,100 (1,000 above its estimate): the day is 100 tokens
/// in debt, so the next token is 101 × 86.4 s = 8,726.4 s away. The Rust gate says so; the Lua
/// twin's `load_tat` clamps a TAT to a minute past the tolerance (TAT_MOST_DEBT, meant for the
/// per-minute budgets), so Redis forgets all but ~0.7 token of the debt and says ~146 s.
#[tokio::test]
async fn a_settled_excess_on_a_day_budget_is_kept_by_both_twins() {
    let config = config();
    // Rust twin.
    let me = Instance::new("me").expect("instance");
    let mut local = LocalGate::for_upstream(&config);
    let now = 1_000_000;
    let id = PermitId::new(None, &me, 1, None);
    let ask = [Ask { id: id.clone(), tokens: 100, output: 0, waiting: 1 }];
    assert!(local.acquire(&me, &ask, 30_000, now).is_granted());
    local.finish(&id, 1, WaveSignal::Success, 1_000i64, now);
    let rust = local.budget_status(now).tokens_per_day.expect("a tokens per day budget");
    assert_eq!(rust, (0, 8_726_400));

    // Lua twin.
    let server = RedisServer::start().expect("redis-server");
    let store = Store::connect(StoreConfig::new(server.url())).await.expect("store");
    let shared = SharedGate::for_upstream(store, &config);
    let wave = match shared.acquire_text("a", LEASE, 100).await.expect("acquire").admission {
        Admission::Granted { wave, .. } => wave,
        denied => panic!("{denied:?}"),
    };
    shared.finish_text("a", wave, WaveSignal::Success, 1_000i64).await.expect("finish");
    let lua = shared.status().await.expect("status").budgets.tokens_per_day.expect("a tokens per day budget");
    assert_eq!(lua.0, 0);
    assert!(lua.1.abs_diff(rust.1) < 5_000, "the next token of the day: Rust {} ms, Lua {} ms", rust.1, lua.1);
    // And the next acquire of one token: Rust refuses for ~2.4 h; Redis?
    match shared.acquire_text("b", LEASE, 1).await.expect("acquire").admission {
        Admission::Denied { retry_after_ms, .. } => {
            assert!(retry_after_ms > 8_000_000, "Redis refuses one token for only {retry_after_ms} ms")
        }
        granted => panic!("granted: {granted:?}"),
    }
}

/// A fallback used the whole day's burst and six seconds' refill while the store was away:
/// the reconciliation charges those 16 requests from the outage's start, so the day is empty
/// with its next request a second away (both twins). Charged at the reconciliation's end, the
/// six seconds of refill that paid for six of them were taken again: the fleet waited 7 s — a
/// six-hour outage, six hours.
#[tokio::test]
async fn an_outages_day_usage_is_charged_from_its_start_in_both_twins() {
    // One request a second, ten at once.
    let config = UpstreamConfig::builder("rpd").limit(10).requests_per_day(86_400, 10).build().expect("valid");
    let usage = OutageUsage::new(16, 0, Duration::from_secs(6));
    let mut local = LocalGate::for_upstream(&config);
    let now = 1_000_000_000;
    local.charge(usage, now);
    let rust = local.budget_status(now).requests_per_day.expect("a requests per day budget");
    assert_eq!(rust, (0, 1_000));

    let server = RedisServer::start().expect("redis-server");
    let store = Store::connect(StoreConfig::new(server.url())).await.expect("store");
    let shared = SharedGate::for_upstream(store, &config);
    shared.reconcile(&[], &[], LEASE, usage).await.expect("reconcile");
    let lua = shared.status().await.expect("status").budgets.requests_per_day.expect("a requests per day budget");
    assert_eq!(lua.0, 0);
    assert!(lua.1 <= 1_000 && lua.1 >= 900, "the next request of the day in {} ms, not ~1,000", lua.1);

    // A usage far beyond the day (a clock gone wrong, a corrupted count) is kept as a day of
    // debt at most, in both twins.
    let absurd = OutageUsage::new(10_000_000, 0, Duration::ZERO);
    local.charge(absurd, now);
    let rust = local.budget_status(now).requests_per_day.expect("a requests per day budget");
    assert_eq!(rust, (0, 86_400_000 + 1_000));
    shared.reconcile(&[], &[], LEASE, absurd).await.expect("reconcile");
    let lua = shared.status().await.expect("status").budgets.requests_per_day.expect("a requests per day budget");
    assert!(lua.1.abs_diff(rust.1) < 5_000, "Rust {} ms, Lua {} ms", rust.1, lua.1);
}

/// A store that lost its state (`FLUSHALL`) takes back what a process last heard is left of the
/// day, the most spent view winning, as `LocalGate::carry_back_day` does; a store that did not
/// lose it takes nothing from a process's view (it counts more than any process heard).
#[tokio::test]
async fn a_lost_day_is_carried_back_and_a_kept_one_is_left_alone() {
    let config = UpstreamConfig::builder("rpd").limit(10).requests_per_day(8, 8).build().expect("valid");
    let server = RedisServer::start().expect("redis-server");
    let store = Store::connect(StoreConfig::new(server.url())).await.expect("store");
    let shared = SharedGate::for_upstream(store, &config);
    for i in 0..6 {
        let granted = shared.acquire_text(&format!("p{i}"), LEASE, 0).await.expect("acquire").admission;
        assert!(matches!(granted, Admission::Granted { .. }), "{granted:?}");
    }
    let left = |n: u64| Some(DayLeft { requests: Some(n), tokens: None });
    let day = |shared: &SharedGate| {
        let shared = shared.clone();
        async move { shared.status().await.expect("status").budgets.requests_per_day.expect("a day").0 }
    };
    // Kept: a view of 1 left or of 8 left changes nothing (2 left).
    shared.reconcile(&[], &[], LEASE, OutageUsage::NONE.with_day_left(left(1))).await.expect("reconcile");
    shared.reconcile(&[], &[], LEASE, OutageUsage::NONE.with_day_left(left(8))).await.expect("reconcile");
    assert_eq!(day(&shared).await, 2);
    // Lost: the views carried back tighten the fresh day, the most spent winning.
    let mut con = server.connection().expect("connection");
    redis::cmd("FLUSHALL").exec(&mut con).expect("FLUSHALL");
    shared.reconcile(&[], &[], LEASE, OutageUsage::NONE.with_day_left(left(3))).await.expect("reconcile");
    assert_eq!(day(&shared).await, 3);
    // The Rust twin, from a fresh day: the same.
    let mut local = LocalGate::for_upstream(&config);
    local.carry_back_day(DayLeft { requests: Some(3), tokens: None }, 1_000_000);
    local.carry_back_day(DayLeft { requests: Some(5), tokens: None }, 1_000_000);
    assert_eq!(local.budget_status(1_000_000).requests_per_day.map(|(left, _)| left), Some(3));
}

/// Review 33, finding 5: a reconciliation whose reply was lost is sent again with the same
/// usage; the store charges it once (its id among the recent ones), and another usage in full.
#[tokio::test]
async fn a_usage_sent_again_is_charged_once() {
    // One request a second, ten at once.
    let config = UpstreamConfig::builder("rpd").limit(10).requests_per_day(86_400, 10).build().expect("valid");
    let server = RedisServer::start().expect("redis-server");
    let store = Store::connect(StoreConfig::new(server.url())).await.expect("store");
    let shared = SharedGate::for_upstream(store, &config);
    let left = || async { shared.status().await.expect("status").budgets.requests_per_day.expect("a day").0 };
    let usage = OutageUsage::new(4, 0, Duration::ZERO).with_id(0x0123_4567_89ab_cdef);
    shared.reconcile(&[], &[], LEASE, usage).await.expect("reconcile");
    assert_eq!(left().await, 6);
    shared.reconcile(&[], &[], LEASE, usage).await.expect("reconcile again");
    assert_eq!(left().await, 6, "the same usage, charged twice");
    shared.reconcile(&[], &[], LEASE, usage.with_id(7)).await.expect("another usage");
    assert_eq!(left().await, 2);
}
