//! Pools through the public API: one logical upstream over several members (keys), each a
//! configured upstream in front of its own mock provider. The mocks count what really arrives.

use std::time::Duration;

use wavegate::config::{PoolConfigError, PoolPolicy};
use wavegate::{BuildError, Error, ErrorKind, Outcome, PoolConfig, Scheduler, UpstreamConfig};

mod common;
use common::classify;
use wavegate_testkit::{
    HeaderStyle, HttpReply, MockProvider, MockUpstream, MockUpstreamConfig, ProviderLimits, http_get,
};

const TIMEOUT: Duration = Duration::from_secs(5);
const SERVICE: Duration = Duration::from_millis(2);

fn limits(requests: u64, quota_exhausted: bool) -> ProviderLimits {
    ProviderLimits {
        style: HeaderStyle::OpenAi,
        requests: Some(requests),
        tokens: None,
        window: Duration::from_secs(60),
        quota_exhausted,
    }
}

fn member(name: &str) -> UpstreamConfig {
    UpstreamConfig::builder(name).limit(4).max_wait(Duration::from_secs(5)).build().expect("valid")
}

/// A scheduler with members `key-0 .. key-{n-1}` pooled as `llm`.
fn pooled(n: usize, policy: PoolPolicy, weights: &[u32]) -> Scheduler {
    let mut builder = common::isolated();
    let mut pool = PoolConfig::builder("llm").policy(policy);
    for i in 0..n {
        builder = builder.upstream(member(&format!("key-{i}")));
        pool = pool.member(format!("key-{i}"), weights.get(i).copied().unwrap_or(1));
    }
    builder.pool(pool.build().expect("valid pool")).build().expect("scheduler")
}

/// One pooled call: the member's name picks the provider it is sent to.
async fn call(s: &Scheduler, addrs: &[std::net::SocketAddr]) -> Result<HttpReply, Error<std::io::Error>> {
    s.pool("llm")
        .expect("configured")
        .request()
        .classify(classify)
        .call(|member, _| {
            let index: usize = member.trim_start_matches("key-").parse().expect("a member name");
            http_get(addrs[index], "/v1/chat", TIMEOUT)
        })
        .await
}

#[actix::test]
async fn equal_members_share_the_requests_evenly() {
    let providers: Vec<MockProvider> =
        (0..3).map(|_| MockProvider::start(limits(1_000, false), SERVICE).unwrap()).collect();
    let addrs: Vec<_> = providers.iter().map(MockProvider::addr).collect();
    let s = pooled(3, PoolPolicy::MostHeadroom, &[]);
    for _ in 0..30 {
        call(&s, &addrs).await.expect("served");
    }
    let served: Vec<u64> = providers.iter().map(MockProvider::served).collect();
    assert_eq!(served, [10, 10, 10]);
    let statuses = s.pool("llm").unwrap().status().await.expect("status");
    let names: Vec<&str> = statuses.iter().map(|st| st.upstream.as_str()).collect();
    assert_eq!(names, ["key-0", "key-1", "key-2"], "status per member");
}

#[actix::test]
async fn weights_share_the_requests_in_proportion() {
    let providers: Vec<MockProvider> =
        (0..2).map(|_| MockProvider::start(limits(1_000, false), SERVICE).unwrap()).collect();
    let addrs: Vec<_> = providers.iter().map(MockProvider::addr).collect();
    let s = pooled(2, PoolPolicy::Weighted, &[1, 3]);
    for _ in 0..40 {
        call(&s, &addrs).await.expect("served");
    }
    assert_eq!((providers[0].served(), providers[1].served()), (10, 30));
}

#[actix::test]
async fn a_member_whose_window_is_spent_is_left_alone_until_its_reset() {
    // key-0 takes 2 requests a minute, the others plenty: nobody meets key-0's 429.
    let providers = [
        MockProvider::start(limits(2, false), SERVICE).unwrap(),
        MockProvider::start(limits(1_000, false), SERVICE).unwrap(),
        MockProvider::start(limits(1_000, false), SERVICE).unwrap(),
    ];
    let addrs: Vec<_> = providers.iter().map(MockProvider::addr).collect();
    let s = pooled(3, PoolPolicy::MostHeadroom, &[]);
    let started = std::time::Instant::now();
    for _ in 0..30 {
        call(&s, &addrs).await.expect("served");
    }
    // Nobody waited in key-0's queue for its reset (a minute away) or its max wait (5 s).
    assert!(started.elapsed() < Duration::from_secs(2), "{:?}", started.elapsed());
    assert_eq!(providers[0].served(), 2);
    assert_eq!(providers[0].rate_limited(), 0, "the spent window was heard, not hit");
    assert_eq!(providers[1].served() + providers[2].served(), 28);
}

#[actix::test]
async fn a_429_or_a_spent_quota_moves_the_request_to_another_member() {
    // key-0 refuses everything with a plain 429, key-1's quota is spent, key-2 serves.
    let refusing =
        MockUpstream::start(MockUpstreamConfig { capacity: Some(0), ..MockUpstreamConfig::default() }).unwrap();
    let spent = MockProvider::start(limits(1_000, true), SERVICE).unwrap();
    let serving = MockProvider::start(limits(1_000, false), SERVICE).unwrap();
    let addrs = [refusing.addr(), spent.addr(), serving.addr()];
    let s = pooled(3, PoolPolicy::MostHeadroom, &[]);
    for _ in 0..10 {
        call(&s, &addrs).await.expect("served by key-2");
    }
    assert_eq!(serving.served(), 10);
    assert_eq!(spent.rate_limited(), 1, "a spent quota costs one attempt, then the member is skipped");
    assert!(refusing.rate_limited() >= 1, "key-0 was tried");
    assert!(refusing.rate_limited() <= 3, "key-0's 429s cool it down: {} tries", refusing.rate_limited());
    let statuses = s.pool("llm").unwrap().status().await.expect("status");
    assert!(statuses[1].quota_exhausted_for.is_some(), "visible per member");
}

#[actix::test]
async fn when_every_member_refuses_the_request_ends_by_its_deadline() {
    let refusing: Vec<MockUpstream> = (0..2)
        .map(|_| {
            MockUpstream::start(MockUpstreamConfig { capacity: Some(0), ..MockUpstreamConfig::default() }).unwrap()
        })
        .collect();
    let addrs: Vec<_> = refusing.iter().map(MockUpstream::addr).collect();
    let s = pooled(2, PoolPolicy::MostHeadroom, &[]);
    let started = std::time::Instant::now();
    let deadline = started + Duration::from_millis(1_500);
    let result = s
        .pool("llm")
        .unwrap()
        .request()
        .deadline(deadline)
        .classify(classify)
        .call(|member, _| {
            let index: usize = member.trim_start_matches("key-").parse().unwrap();
            http_get(addrs[index], "/", TIMEOUT)
        })
        .await;
    assert!(result.is_err(), "{result:?}");
    assert!(started.elapsed() < Duration::from_millis(1_700), "{:?}", started.elapsed());
    let tries: u64 = refusing.iter().map(MockUpstream::rate_limited).sum();
    assert!((2..=6).contains(&tries), "{tries} attempts: each member, then after Retry-After, no storm");
}

#[actix::test]
async fn when_every_members_quota_is_spent_the_request_fails_at_once() {
    let spent: Vec<MockProvider> = (0..2).map(|_| MockProvider::start(limits(1_000, true), SERVICE).unwrap()).collect();
    let addrs: Vec<_> = spent.iter().map(MockProvider::addr).collect();
    let s = pooled(2, PoolPolicy::MostHeadroom, &[]);
    let started = std::time::Instant::now();
    let error = call(&s, &addrs).await.expect_err("no key has quota");
    assert_eq!((error.kind(), error.attempts()), (ErrorKind::QuotaExhausted, Some(2)), "{error:?}");
    let refused = call(&s, &addrs).await.expect_err("refused at once");
    assert_eq!((refused.kind(), refused.attempts()), (ErrorKind::QuotaExhausted, Some(0)), "{refused:?}");
    assert!(started.elapsed() < Duration::from_millis(500), "{:?}", started.elapsed());
    assert_eq!(spent.iter().map(MockProvider::rate_limited).sum::<u64>(), 2, "one attempt per key");
}

#[test]
fn a_pool_over_names_that_are_not_upstreams_is_refused() {
    let built = Scheduler::builder()
        .upstream(member("key-0"))
        .pool(PoolConfig::builder("llm").member("key-0", 1).member("key-9", 1).build().unwrap())
        .build();
    match built {
        Err(BuildError::Pool(PoolConfigError::UnknownMember { member, .. })) => assert_eq!(member, "key-9"),
        other => panic!("{:?}", other.map(|_| ())),
    }
    let s = common::isolated()
        .upstream(member("key-0"))
        .pool(PoolConfig::builder("llm").member("key-0", 1).build().unwrap())
        .build()
        .unwrap();
    assert!(s.pool("nope").is_err());
}

/// Two members with classes; `narrow` knows only `batch`.
fn with_classes() -> Scheduler {
    let wide = UpstreamConfig::builder("wide").limit(1).max_wait(Duration::from_millis(200)).class("interactive", 3);
    let wide = wide.class("batch", 1).build().expect("valid");
    let narrow = UpstreamConfig::builder("narrow").limit(1).max_wait(Duration::from_millis(200)).class("batch", 1);
    let pool = PoolConfig::builder("llm").member("wide", 1).member("narrow", 1).build().expect("valid pool");
    common::isolated().upstream(wide).upstream(narrow.build().expect("valid")).pool(pool).build().expect("scheduler")
}

#[tokio::test]
async fn a_pooled_request_takes_the_same_settings_as_an_upstream_request() {
    let s = with_classes();
    let llm = s.pool("llm").expect("configured");
    // A class only one member has: that member serves it (the other refuses it before any wait).
    for _ in 0..3 {
        let served = llm
            .request()
            .priority("interactive")
            .tenant("acme")
            .timeout(Duration::from_secs(2))
            .call(|member, _| async move { Ok::<_, Outcome>(member) })
            .await
            .expect("the member with the class serves it");
        assert_eq!(served, "wide");
    }
    // A class no member has: refused, naming the class.
    let error = llm
        .request()
        .priority("urgent")
        .call(|_, _| async { Ok::<_, Outcome>(()) })
        .await
        .expect_err("no member has the class");
    assert_eq!((error.kind(), error.class()), (ErrorKind::UnknownClass, Some("urgent")));
    // A deadline that passes while every member is busy ends the request.
    let held: Vec<_> = [s.upstream("wide"), s.upstream("narrow")]
        .into_iter()
        .map(|u| async move { u.expect("configured").request().acquire().await.expect("a permit") })
        .collect();
    let held = futures_util::future::join_all(held).await;
    let started = std::time::Instant::now();
    let error = llm
        .request()
        .timeout(Duration::from_millis(150))
        .call(|_, _| async { Ok::<_, Outcome>(()) })
        .await
        .expect_err("every member is full");
    assert!(started.elapsed() < Duration::from_millis(600), "ended after {:?}", started.elapsed());
    assert!(error.is_overload() || error.kind() == ErrorKind::DeadlinePassed, "{error:?}");
    drop(held);
}

#[tokio::test]
async fn a_pooled_acquire_gives_a_permit_of_a_member_with_room() {
    let s = with_classes();
    let llm = s.pool("llm").expect("configured");
    let first = llm.request().acquire().await.expect("a permit");
    let second = llm.request().acquire().await.expect("a permit of the other member");
    let mut members = [first.upstream().to_owned(), second.upstream().to_owned()];
    members.sort();
    assert_eq!(members, ["narrow", "wide"], "each member's only permit");
    // Both full: the next waits, then gives up with the members' refusal.
    let error = llm.request().acquire().await.expect_err("no room anywhere");
    assert!(error.is_overload(), "{error:?}");
    first.succeeded();
    let again = llm.request().acquire().await.expect("room again");
    again.succeeded();
    second.succeeded();
}

/// Ordered spillover: the primary (limit 4) takes what it can hold, the overflow the rest; once
/// the primary has room again, it takes everything.
#[actix::test]
async fn spillover_fills_the_primary_first_then_the_next() {
    let slow = Duration::from_millis(300);
    let mocks: Vec<MockUpstream> = (0..2)
        .map(|_| MockUpstream::start(MockUpstreamConfig { service_time: slow, ..Default::default() }).unwrap())
        .collect();
    let addrs: Vec<_> = mocks.iter().map(MockUpstream::addr).collect();
    let s = pooled(2, PoolPolicy::Spillover, &[]);
    let burst = futures_util::future::join_all((0..6).map(|_| call(&s, &addrs))).await;
    assert!(burst.iter().all(Result::is_ok));
    let at_once: Vec<usize> = mocks.iter().map(MockUpstream::max_in_flight).collect();
    assert_eq!(at_once, [4, 2], "the primary full, the rest to the overflow");
    for mock in &mocks {
        mock.reset_max_in_flight();
    }
    let before = mocks[1].calls();
    for _ in 0..3 {
        call(&s, &addrs).await.expect("served");
    }
    assert_eq!(mocks[1].calls(), before, "with room, the primary takes every call");
}

/// Ordered spillover across two processes on a real Redis: the primary's room is judged from
/// the fleet's permits, so a process whose calls the other filled passes them on.
#[cfg(feature = "redis")]
#[actix::test]
async fn spillover_passes_on_what_the_fleet_filled() {
    let slow = Duration::from_millis(300);
    let mocks: Vec<MockUpstream> = (0..2)
        .map(|_| MockUpstream::start(MockUpstreamConfig { service_time: slow, ..Default::default() }).unwrap())
        .collect();
    let addrs: Vec<_> = mocks.iter().map(MockUpstream::addr).collect();
    // The primary's four permits held by one process, the other's calls spill over.
    let redis = wavegate_testkit::RedisServer::start().expect("redis-server");
    let shared = || {
        let mut builder = Scheduler::builder().redis(redis.url());
        let mut pool = PoolConfig::builder("llm").policy(PoolPolicy::Spillover);
        for i in 0..2 {
            builder = builder.upstream(member(&format!("key-{i}")));
            pool = pool.member(format!("key-{i}"), 1);
        }
        builder.pool(pool.build().expect("valid pool")).build().expect("scheduler")
    };
    let (a, b) = (shared(), shared());
    // b learns the primary's fleet count from its own call, then a fills the primary.
    call(&b, &addrs).await.expect("served");
    let primary = a.upstream("key-0").expect("member");
    let held: Vec<_> =
        futures_util::future::join_all((0..4).map(|_| primary.request().acquire())).await.into_iter().collect();
    let held: Vec<_> = held.into_iter().map(|p| p.expect("a primary permit")).collect();
    let before = (mocks[0].calls(), mocks[1].calls());
    // b's first call: the primary's room as b last heard it was 4, so it asks there, is told the
    // fleet is at the limit and passes on within the spill patience; its second call knows.
    let mut took = Vec::new();
    for _ in 0..2 {
        let started = std::time::Instant::now();
        call(&b, &addrs).await.expect("served");
        took.push(started.elapsed());
    }
    println!("b's calls spilled over in {took:?}");
    assert_eq!((mocks[0].calls(), mocks[1].calls()), (before.0, before.1 + 2), "b's calls went to the overflow");
    assert!(took[0] < Duration::from_secs(1), "the first passed on within the patience: {took:?}");
    assert!(took[1] < slow + Duration::from_millis(150), "the second spilled at once: {took:?}");
    drop(held);
}

/// `pooled(3, ..)` with a fourth upstream, `key-3`, that the pool was not configured with.
fn pooled_with_spare(policy: PoolPolicy) -> Scheduler {
    let mut builder = common::isolated();
    let mut pool = PoolConfig::builder("llm").policy(policy);
    for i in 0..4 {
        builder = builder.upstream(member(&format!("key-{i}")));
        if i < 3 {
            pool = pool.member(format!("key-{i}"), 1);
        }
    }
    builder.pool(pool.build().expect("valid pool")).build().expect("scheduler")
}

/// Members changed live, in one process: taken out, put in (an upstream the pool was not
/// configured with), overridden for a time, cleared; the mocks count where the calls went.
#[actix::test]
async fn members_taken_out_and_put_in_live_get_the_requests_they_should() {
    let providers: Vec<MockProvider> =
        (0..4).map(|_| MockProvider::start(limits(1_000, false), SERVICE).unwrap()).collect();
    let addrs: Vec<_> = providers.iter().map(MockProvider::addr).collect();
    let s = pooled_with_spare(PoolPolicy::MostHeadroom);
    let llm = s.pool("llm").expect("configured");
    let served = || providers.iter().map(MockProvider::served).collect::<Vec<u64>>();

    llm.set_member("key-1", 0).await.expect("taken out");
    assert_eq!(llm.members_in_force(), [("key-0", 1), ("key-2", 1)]);
    for _ in 0..20 {
        call(&s, &addrs).await.expect("served");
    }
    assert_eq!(served(), [10, 0, 10, 0], "no call to the member taken out");

    llm.set_member("key-3", 1).await.expect("put in");
    assert_eq!(llm.members_in_force(), [("key-0", 1), ("key-2", 1), ("key-3", 1)], "after the configured ones");
    for _ in 0..30 {
        call(&s, &addrs).await.expect("served");
    }
    // The newcomer first (fewest picked) until it caught up with 10, then each in turn.
    assert_eq!(served(), [17, 0, 17, 16], "the newcomer takes its share");

    // An override reverts by itself: key-0 out for 300 ms.
    llm.override_member("key-0", 0, Duration::from_millis(300)).await.expect("override");
    assert_eq!(llm.members_in_force(), [("key-2", 1), ("key-3", 1)]);
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(llm.members_in_force(), [("key-0", 1), ("key-2", 1), ("key-3", 1)], "the override ran out");

    // Cleared: back to the configuration (key-3 was never a configured member: out again).
    llm.clear_member("key-1").await.expect("cleared");
    llm.clear_member("key-3").await.expect("cleared");
    assert_eq!(llm.members_in_force(), [("key-0", 1), ("key-1", 1), ("key-2", 1)]);

    // Every member out: the pool keeps its configured members rather than refusing everything.
    for i in 0..3 {
        llm.set_member(&format!("key-{i}"), 0).await.expect("taken out");
    }
    assert_eq!(llm.members_in_force(), [("key-0", 1), ("key-1", 1), ("key-2", 1)]);
    call(&s, &addrs).await.expect("still served");

    // Bad input: a clear typed error, nothing changed.
    let unknown = llm.set_member("key-9", 1).await.expect_err("not an upstream");
    assert_eq!(unknown.kind(), ErrorKind::UnknownUpstream, "{unknown}");
    let heavy = llm.set_member("key-0", 1001).await.expect_err("too heavy");
    assert_eq!(heavy.kind(), ErrorKind::InvalidSetting, "{heavy}");
    assert!(heavy.to_string().contains("above 1000"), "{heavy}");
}

/// A member taken out by one process on a real Redis: the other process's pool leaves it
/// within a second (the change is announced fleet-wide), and none of its calls go there.
#[cfg(feature = "redis")]
#[actix::test]
async fn a_member_taken_out_by_one_process_is_left_by_the_fleet_within_a_second() {
    let providers: Vec<MockProvider> =
        (0..2).map(|_| MockProvider::start(limits(1_000, false), SERVICE).unwrap()).collect();
    let addrs: Vec<_> = providers.iter().map(MockProvider::addr).collect();
    let redis = wavegate_testkit::RedisServer::start().expect("redis-server");
    let shared = || {
        let mut builder = Scheduler::builder().redis(redis.url());
        let mut pool = PoolConfig::builder("llm");
        for i in 0..2 {
            builder = builder.upstream(member(&format!("key-{i}")));
            pool = pool.member(format!("key-{i}"), 1);
        }
        builder.pool(pool.build().expect("valid pool")).build().expect("scheduler")
    };
    let (a, b) = (shared(), shared());
    for _ in 0..4 {
        call(&b, &addrs).await.expect("served");
    }
    let version = a.pool("llm").unwrap().set_member("key-0", 0).await.expect("stored");
    let changed = std::time::Instant::now();
    let b_llm = b.pool("llm").unwrap();
    while b_llm.members_in_force() != [("key-1", 1)] {
        assert!(changed.elapsed() < Duration::from_secs(1), "b did not apply version {version} within 1 s");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    println!("b left key-0 {:?} after a's change (version {version})", changed.elapsed());
    let before: Vec<u64> = providers.iter().map(MockProvider::served).collect();
    for _ in 0..10 {
        call(&b, &addrs).await.expect("served");
    }
    assert_eq!(providers[0].served(), before[0], "no call of b to the member taken out");
    assert_eq!(providers[1].served(), before[1] + 10);
    // Back, for both.
    a.pool("llm").unwrap().clear_member("key-0").await.expect("stored");
    let cleared = std::time::Instant::now();
    while b_llm.members_in_force().len() != 2 {
        assert!(cleared.elapsed() < Duration::from_secs(1), "b did not take key-0 back within 1 s");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}
