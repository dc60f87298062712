//! Shadow mode through the public API: no call is held back (the mock provider counts what
//! really arrives at once), and what the policy would have done — how long each call would
//! have waited, which it would have refused, where the wave would have put the limit — is
//! recorded, and matches what the same load measured when enforcing. Local mode, and shared
//! mode on a real Redis with the mode switched live for two schedulers.

use std::time::{Duration, Instant};

use futures_util::future::join_all;
use wavegate::config::UpstreamConfigBuilder;
#[cfg(feature = "redis")]
use wavegate::{ClassSetting, LiveChange};
use wavegate::{Scheduler, ShadowStatus, Upstream, UpstreamConfig};
#[cfg(feature = "redis")]
use wavegate_testkit::RedisServer;
use wavegate_testkit::{MockUpstream, MockUpstreamConfig};

mod common;
use common::call_mock;

const SERVICE: Duration = Duration::from_millis(200);

fn mock(capacity: Option<usize>) -> MockUpstream {
    MockUpstream::start(MockUpstreamConfig { capacity, service_time: SERVICE, ..Default::default() }).expect("mock")
}

fn local(config: UpstreamConfigBuilder) -> (Scheduler, Upstream) {
    let scheduler = common::isolated().upstream(config.build().expect("config")).build().expect("scheduler");
    let upstream = scheduler.upstream("llm").expect("configured");
    (scheduler, upstream)
}

/// `n` calls to the mock at once, each in the default class or `class`; how long each waited
/// for its permit (its first attempt's), and whether it succeeded.
async fn burst(upstream: &Upstream, mock: &MockUpstream, n: usize, class: Option<&str>) -> Vec<(Duration, bool)> {
    let addr = mock.addr();
    join_all((0..n).map(|_| async move {
        let mut waited = None;
        let request = match class {
            Some(class) => upstream.request().priority(class),
            None => upstream.request(),
        };
        let result = request
            .call(|attempt| {
                waited.get_or_insert(attempt.waited);
                call_mock(addr)
            })
            .await;
        (waited.unwrap_or_default(), result.is_ok())
    }))
    .await
}

/// The shadow counts once no ghost waits any more (bounded).
async fn settled(upstream: &Upstream) -> ShadowStatus {
    let started = Instant::now();
    loop {
        let shadow = upstream.status().await.expect("status").shadow;
        if shadow.calls > 0 && shadow.waiting == 0 {
            return shadow;
        }
        assert!(started.elapsed() < Duration::from_secs(10), "ghosts still waiting: {shadow:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Within `share` of `expected`.
fn near(measured: Duration, expected: Duration, share: f64) -> bool {
    (measured.as_secs_f64() - expected.as_secs_f64()).abs() <= expected.as_secs_f64() * share
}

#[actix::test]
async fn shadow_lets_every_call_through_and_records_the_waits_enforcing_measured() {
    // Enforcing: 8 calls at once at a limit of 2 go 2 by 2.
    let enforcing = mock(None);
    let (_scheduler, upstream) = local(UpstreamConfig::builder("llm").limit(2));
    let waits = burst(&upstream, &enforcing, 8, None).await;
    assert!(waits.iter().all(|(_, ok)| *ok));
    assert_eq!(enforcing.max_in_flight(), 2);
    let enforced_total: Duration = waits.iter().map(|(w, _)| *w).sum();
    let enforced_waited = waits.iter().filter(|(w, _)| *w >= Duration::from_millis(1)).count() as u64;
    let enforced_max = waits.iter().map(|(w, _)| *w).max().unwrap_or_default();

    // The same load in shadow: all 8 at once at the provider, no wait, the waits recorded.
    let shadowed = mock(None);
    let (_scheduler, upstream) = local(UpstreamConfig::builder("llm").limit(2).shadow(true));
    let started = Instant::now();
    let waits = burst(&upstream, &shadowed, 8, None).await;
    assert!(waits.iter().all(|(w, ok)| *ok && w.is_zero()), "{waits:?}");
    assert!(started.elapsed() < SERVICE * 2, "held back: {:?}", started.elapsed());
    assert_eq!(shadowed.max_in_flight(), 8, "every call at the provider at once");
    let shadow = settled(&upstream).await;
    assert_eq!((shadow.upstream, shadow.calls, shadow.would_have_granted), (true, 8, 8), "{shadow:?}");
    assert_eq!(shadow.would_have_waited, enforced_waited, "{shadow:?}");
    assert!(near(shadow.would_have_waited_total, enforced_total, 0.10), "{shadow:?} vs {enforced_total:?}");
    assert!(near(shadow.would_have_waited_max, enforced_max, 0.10), "{shadow:?} vs {enforced_max:?}");
    assert_eq!(shadow.refused(), 0);
}

#[actix::test]
async fn a_ghost_refused_is_recorded_and_its_call_goes_on() {
    let provider = mock(None);
    let config = UpstreamConfig::builder("llm").limit(1).queue_capacity(1).shadow(true);
    let (_scheduler, upstream) = local(config);
    let calls = burst(&upstream, &provider, 3, None).await;
    assert!(calls.iter().all(|(_, ok)| *ok), "every call went on");
    assert_eq!(provider.max_in_flight(), 3);
    let shadow = settled(&upstream).await;
    assert_eq!(shadow.would_have_granted, 2, "{shadow:?}");
    assert_eq!(shadow.would_have_refused.get("queue_full"), Some(&1), "{shadow:?}");
}

#[actix::test]
async fn the_wave_learns_from_the_answers_in_shadow() {
    // A provider that serves 3 at once: 8 calls at a limit of 8 get five 429s. In shadow the
    // calls are not held, and the wave steps the limit back as enforcing would have.
    let provider = mock(Some(3));
    let (_scheduler, upstream) = local(UpstreamConfig::builder("llm").limit(8).shadow(true));
    let attempts = std::cell::Cell::new(0);
    let addr = provider.addr();
    join_all((0..8).map(|_| {
        upstream.request().call(|attempt| {
            attempts.set(attempts.get() + 1);
            async move { if attempt.number == 1 { call_mock(addr).await } else { Ok(()) } }
        })
    }))
    .await;
    assert!(provider.rate_limited() >= 5, "the provider refused {}", provider.rate_limited());
    settled(&upstream).await;
    let started = Instant::now();
    while upstream.status().await.expect("status").limit >= 8 {
        assert!(started.elapsed() < Duration::from_secs(5), "the wave never stepped the limit back");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[actix::test]
async fn a_429_met_beyond_the_limit_teaches_nothing_and_its_retry_goes_without_a_ghost() {
    // A provider that serves 3 at once, a limit of 3: enforcing would never send a fourth, so
    // the 429s the fourth to eighth calls meet in shadow are not the limit's. The limit stays,
    // and each refused call's retry (which enforcing would not have made) has no ghost: one
    // ghost per call, as enforcing makes one call each.
    let provider = mock(Some(3));
    let (_scheduler, upstream) = local(UpstreamConfig::builder("llm").limit(3).shadow(true));
    let addr = provider.addr();
    join_all((0..8).map(|_| {
        upstream
            .request()
            .call(|attempt| async move { if attempt.number == 1 { call_mock(addr).await } else { Ok(()) } })
    }))
    .await;
    assert_eq!(provider.rate_limited(), 5, "the provider served three and refused five");
    let shadow = settled(&upstream).await;
    assert_eq!((shadow.calls, shadow.retries_without_ghost), (13, 5), "{shadow:?}");
    assert_eq!(shadow.would_have_granted, 8, "a ghost per call: {shadow:?}");
    let status = upstream.status().await.expect("status");
    assert_eq!((status.limit, status.wave), (3, 1), "nothing learned from the 429s beyond the limit");
}

#[actix::test]
async fn a_class_in_shadow_goes_at_once_and_takes_its_would_be_permits() {
    let provider = mock(None);
    let config =
        UpstreamConfig::builder("llm").limit(2).class("interactive", 1).class("batch", 1).shadow_class("batch");
    let (_scheduler, upstream) = local(config);
    let addr = provider.addr();
    let batch = burst(&upstream, &provider, 4, Some("batch"));
    let interactive = async {
        // Asks once the batch ghosts hold both permits.
        tokio::time::sleep(Duration::from_millis(50)).await;
        let mut waited = Duration::ZERO;
        upstream
            .request()
            .priority("interactive")
            .call(|attempt| {
                waited = attempt.waited;
                call_mock(addr)
            })
            .await
            .expect("interactive call");
        waited
    };
    let (batch, waited) = tokio::join!(batch, interactive);
    assert!(batch.iter().all(|(w, ok)| *ok && w.is_zero()), "batch calls went at once: {batch:?}");
    assert!(provider.max_in_flight() >= 4, "{}", provider.max_in_flight());
    // Enforced: it waited for a batch ghost's permit (the first two end after ~200 ms).
    assert!(waited >= Duration::from_millis(100), "interactive waited {waited:?}");
    let shadow = settled(&upstream).await;
    assert_eq!((shadow.upstream, shadow.classes.as_slice(), shadow.calls), (false, &["batch".to_owned()][..], 4));
}

/// Two schedulers on one Redis with `upstream` in shadow at limit 3 (a fleet: each counts
/// only its own calls at the provider), just started: neither has seen the other's heartbeat
/// yet, and each judges its calls by the fleet's record from the first.
#[cfg(feature = "redis")]
async fn fleet_in_shadow(redis: &RedisServer) -> [(Scheduler, Upstream); 2] {
    let build = || {
        let config = UpstreamConfig::builder("llm").limit(3).shadow(true).build().expect("config");
        let scheduler = Scheduler::builder().upstream(config).redis(redis.url()).build().expect("scheduler");
        let upstream = scheduler.upstream("llm").expect("llm");
        (scheduler, upstream)
    };
    [build(), build()]
}

/// How many calls the fleet's record of calls at the provider holds.
#[cfg(feature = "redis")]
fn recorded_calls(redis: &RedisServer) -> usize {
    let mut con = redis.connection().expect("connection");
    redis::cmd("ZCARD").arg("wavegate:{llm}:served").query(&mut con).expect("ZCARD")
}

/// `n` calls through `upstream` whose first attempt goes to the mock (a retry succeeds at once).
#[cfg(feature = "redis")]
async fn first_attempts(upstream: &Upstream, addr: std::net::SocketAddr, n: usize) {
    join_all((0..n).map(|_| {
        upstream
            .request()
            .call(|attempt| async move { if attempt.number == 1 { call_mock(addr).await } else { Ok(()) } })
    }))
    .await;
}

/// The wave of both schedulers once the 429s' judgements are in (they wait for the calls
/// beside them to end: a second before any call has succeeded).
#[cfg(feature = "redis")]
async fn judged_waves(fleet: &[(Scheduler, Upstream); 2]) -> [u64; 2] {
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let mut waves = [0; 2];
    for (wave, (_, upstream)) in waves.iter_mut().zip(fleet) {
        *wave = upstream.status().await.expect("status").wave;
    }
    waves
}

#[cfg(feature = "redis")]
#[actix::test]
async fn in_a_fleet_a_429_beside_the_limits_worth_of_served_calls_teaches_nothing() {
    // A provider that serves 3 at once, a limit of 3, two schedulers sending 4 calls each at
    // once: the provider serves 3 and refuses 5, while neither scheduler has more than 4 of
    // its own calls there. Enforcing would have sent 3: the fleet's record of the calls at the
    // provider puts each refusal beside the 3 served, so nothing is learned; each refused
    // call's ghost stands for the whole call, and its retry goes without one.
    let redis = RedisServer::start().expect("redis-server");
    let provider = mock(Some(3));
    let fleet = fleet_in_shadow(&redis).await;
    let addr = provider.addr();
    tokio::join!(first_attempts(&fleet[0].1, addr, 4), first_attempts(&fleet[1].1, addr, 4));
    assert_eq!(provider.rate_limited(), 5, "the provider served three and refused five");
    let (a, b) = (settled(&fleet[0].1).await, settled(&fleet[1].1).await);
    assert_eq!(a.retries_without_ghost + b.retries_without_ghost, 5, "{a:?} {b:?}");
    assert_eq!(a.would_have_granted + b.would_have_granted, 8, "a ghost per call: {a:?} {b:?}");
    assert_eq!(judged_waves(&fleet).await, [1, 1], "nothing learned from 429s beyond the limit");
    // Every attempt recorded as it ended (the retries too: the record cannot tell them apart).
    assert_eq!(recorded_calls(&redis), 13);
}

#[cfg(feature = "redis")]
#[actix::test]
async fn in_a_fleet_a_429_within_the_limit_is_learned() {
    // A provider that serves 2 at once, a limit of 3: one scheduler's two calls are served,
    // the other's one call, sent just after, is refused with three at the provider — as
    // enforcing would have been (3 permits): the wave learns from it.
    let redis = RedisServer::start().expect("redis-server");
    let provider = mock(Some(2));
    let fleet = fleet_in_shadow(&redis).await;
    let addr = provider.addr();
    let later = async {
        tokio::time::sleep(Duration::from_millis(50)).await;
        first_attempts(&fleet[1].1, addr, 1).await;
    };
    tokio::join!(first_attempts(&fleet[0].1, addr, 2), later);
    assert_eq!(provider.rate_limited(), 1);
    assert_eq!(judged_waves(&fleet).await, [2, 2], "the 429 enforcing would have met was learned");
    assert_eq!(recorded_calls(&redis), 4, "three calls and a retry, recorded as each ended");
}

#[cfg(feature = "redis")]
#[actix::test]
async fn shadow_switched_live_reaches_two_schedulers_on_redis() {
    let redis = RedisServer::start().expect("redis-server");
    let provider = mock(None);
    let build = || {
        Scheduler::builder()
            .upstream(UpstreamConfig::builder("llm").limit(2).build().expect("config"))
            .redis(redis.url())
            .build()
            .expect("scheduler")
    };
    let (a, b) = (build(), build());
    let (llm_a, llm_b) = (a.upstream("llm").expect("llm"), b.upstream("llm").expect("llm"));
    // Enforcing: 6 calls from each, at most 2 at the provider.
    tokio::join!(burst(&llm_a, &provider, 6, None), burst(&llm_b, &provider, 6, None));
    assert_eq!(provider.max_in_flight(), 2);

    let version = llm_a.set_shadow(true).await.expect("shadow on");
    for upstream in [&llm_a, &llm_b] {
        let started = Instant::now();
        while upstream.status().await.expect("status").live_version < version {
            assert!(started.elapsed() < Duration::from_secs(1), "shadow on not picked up within 1 s");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    provider.reset_max_in_flight();
    let (ran_a, ran_b) = tokio::join!(burst(&llm_a, &provider, 6, None), burst(&llm_b, &provider, 6, None));
    assert!(ran_a.iter().chain(&ran_b).all(|(w, ok)| *ok && w.is_zero()));
    assert_eq!(provider.max_in_flight(), 12, "in shadow nothing is held back");
    // The ghosts met the fleet's limit: 12 asked for 2 permits, across both schedulers.
    let (shadow_a, shadow_b) = (settled(&llm_a).await, settled(&llm_b).await);
    let waited = shadow_a.would_have_waited + shadow_b.would_have_waited;
    assert_eq!(shadow_a.calls + shadow_b.calls, 12);
    assert!(waited >= 9, "only {waited} of 12 would have waited: {shadow_a:?} {shadow_b:?}");

    // Back on: held to 2 again, and a class setting for a class it does not have is refused.
    let version = llm_b.set_shadow(false).await.expect("shadow off");
    let refused = llm_b.change_live(LiveChange::set_class("batch", ClassSetting::Shadow, 1, None).expect("valid"));
    assert!(refused.await.is_err(), "no class batch");
    for upstream in [&llm_a, &llm_b] {
        let started = Instant::now();
        while upstream.status().await.expect("status").live_version < version {
            assert!(started.elapsed() < Duration::from_secs(1), "shadow off not picked up within 1 s");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    provider.reset_max_in_flight();
    tokio::join!(burst(&llm_a, &provider, 6, None), burst(&llm_b, &provider, 6, None));
    assert_eq!(provider.max_in_flight(), 2);
}

#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scheduler_shut_down_leaves_no_ghost_permit_held_in_the_store() {
    // Without an actix system the scheduler's actors run on a thread of their own, stopped
    // with its last handle (whose drop drains the releases on their way). Two calls of 1.5 s
    // at once in shadow at a limit of 1: the second's ghost waits for the first's permit, then
    // would hold one for 1.5 s more — after both calls returned, and longer than a drain
    // waits. The application drops the scheduler right then: no ghost's permit may stay held
    // in the store until its lease (a fixed TTL here, 660 s).
    let redis = RedisServer::start().expect("redis-server");
    let service = Duration::from_millis(1_500);
    let provider =
        MockUpstream::start(MockUpstreamConfig { service_time: service, ..Default::default() }).expect("mock");
    let config = || UpstreamConfig::builder("llm").limit(1).permit_ttl(Duration::from_secs(660)).shadow(true);
    let build = || {
        let upstream = config().build().expect("config");
        Scheduler::builder().upstream(upstream).redis(redis.url()).build().expect("scheduler")
    };
    let (a, watcher) = (build(), build());
    let llm = a.upstream("llm").expect("llm");
    let ran = burst(&llm, &provider, 2, None).await;
    assert!(ran.iter().all(|(w, ok)| *ok && w.is_zero()), "{ran:?}");
    drop(llm);
    drop(a);
    let llm = watcher.upstream("llm").expect("llm");
    let stopped = Instant::now();
    loop {
        let held = llm.status().await.expect("status").in_flight_fleet;
        if held == Some(0) {
            break;
        }
        assert!(stopped.elapsed() < Duration::from_secs(3), "a ghost's permit is still held: {held:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[actix::test]
async fn a_caller_waiting_when_shadow_is_switched_on_is_let_through() {
    // One permit held; a second caller waits for it. The operator switches the upstream to
    // shadow: "no call is held back" holds for the caller already waiting too — it gets its
    // pass at once, not when the permit comes back (or at its wait bound).
    let (_scheduler, upstream) = local(UpstreamConfig::builder("llm").limit(1).max_wait(Duration::from_secs(5)));
    let held = upstream.request().acquire().await.expect("the one permit");
    let waiting = {
        let upstream = upstream.clone();
        actix::spawn(async move {
            let permit = upstream.request().acquire().await.expect("a permit or a pass");
            (permit.is_shadow(), Instant::now())
        })
    };
    while upstream.status().await.expect("status").queue_depth == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let switched = Instant::now();
    upstream.set_shadow(true).await.expect("shadow on");
    let waited = tokio::time::timeout(Duration::from_secs(1), waiting).await;
    let (shadow, at) = waited.expect("still held back 1 s after shadow on").expect("task");
    assert!(shadow, "let through with a pass");
    assert!(at.duration_since(switched) < Duration::from_millis(200), "{:?}", at.duration_since(switched));
    // Its ghost takes its place: granted once the held permit comes back.
    held.succeeded();
    let shadow = settled(&upstream).await;
    assert_eq!((shadow.calls, shadow.would_have_granted, shadow.waiting), (1, 1, 0), "{shadow:?}");
    assert_eq!(upstream.status().await.expect("status").queue_depth, 0);
}
