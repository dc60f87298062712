//! Priority classes through the public API: a batch flood holds the limit while interactive
//! calls arrive; the interactive ones are served at the next free permit, batch keeps its
//! weighted share, the provider (the mock, which counts) never sees more than the limit. In
//! local mode, and in shared mode with four schedulers (four coordinators, four instance ids)
//! on a real redis-server, the flood in two of them and the interactive calls in the other two.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::time::{Duration, Instant};

use futures_util::future::join_all;
#[cfg(feature = "redis")]
use wavegate::Scheduler;
use wavegate::{ErrorKind, Upstream, UpstreamConfig};
use wavegate_testkit::{MockUpstream, MockUpstreamConfig, http_get};

mod common;

const LIMIT: u32 = 4;
const SERVICE: Duration = Duration::from_millis(40);

fn mock() -> MockUpstream {
    MockUpstream::start(MockUpstreamConfig { service_time: SERVICE, ..Default::default() }).expect("mock provider")
}

fn config() -> UpstreamConfig {
    UpstreamConfig::builder("llm")
        .limit(LIMIT)
        .max_wait(Duration::from_secs(30))
        .class("interactive", 3)
        .class("batch", 1)
        .default_class("batch")
        .build()
        .expect("valid config")
}

/// Keeps `callers` batch calls going (each caller calls again as soon as its call is done)
/// until `stop`; counts the calls done.
async fn flood(llm: Upstream, addr: SocketAddr, callers: usize, stop: Arc<AtomicBool>, done: Arc<AtomicU64>) {
    let caller = |llm: Upstream, stop: Arc<AtomicBool>, done: Arc<AtomicU64>| async move {
        while !stop.load(SeqCst) {
            let reply = llm.request().call(|_| http_get(addr, "/batch", Duration::from_secs(5))).await;
            assert_eq!(reply.expect("a batch call").status, 200);
            done.fetch_add(1, SeqCst);
        }
    };
    join_all((0..callers).map(|_| caller(llm.clone(), stop.clone(), done.clone()))).await;
}

/// `count` interactive calls, one every `every`; the time each waited for its permit.
async fn interactive(llm: Upstream, addr: SocketAddr, count: usize, every: Duration) -> Vec<Duration> {
    let one = |llm: Upstream, start: Duration| async move {
        tokio::time::sleep(start).await;
        let mut waited = Duration::ZERO;
        let reply = llm
            .request()
            .priority("interactive")
            .call(|attempt| {
                waited += attempt.waited;
                http_get(addr, "/interactive", Duration::from_secs(5))
            })
            .await;
        assert_eq!(reply.expect("an interactive call").status, 200);
        waited
    };
    join_all((0..count).map(|k| one(llm.clone(), every * k as u32))).await
}

/// Batch kept going: at least a third of the calls the permits interactive left could serve
/// (starved, it would do next to none; a loaded machine serves fewer than the ideal).
fn assert_not_starved(batch: u64, took: Duration, interactive_calls: usize) {
    let permit_seconds = took.as_secs_f64() * f64::from(LIMIT) - interactive_calls as f64 * SERVICE.as_secs_f64();
    let possible = permit_seconds / SERVICE.as_secs_f64();
    assert!(batch as f64 >= possible / 3.0, "batch did {batch} calls in {took:?}; ~{possible:.0} possible");
}

fn p99(mut waits: Vec<Duration>) -> Duration {
    waits.sort();
    waits[(waits.len() * 99 / 100).min(waits.len() - 1)]
}

/// Runs the flood on `batch` and the interactive calls on `interactive` (handles of one
/// upstream, possibly in different schedulers); the interactive waits, batch calls done.
async fn mixed(batch: &[Upstream], interactive_on: &[Upstream], addr: SocketAddr) -> (Vec<Duration>, u64, Duration) {
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let floods: Vec<_> =
        batch.iter().map(|llm| tokio::spawn(flood(llm.clone(), addr, 100, stop.clone(), done.clone()))).collect();
    // Let the flood fill the limit and the queues first.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let started = Instant::now();
    let waits =
        join_all(interactive_on.iter().map(|llm| interactive(llm.clone(), addr, 30, Duration::from_millis(50))))
            .await
            .concat();
    let took = started.elapsed();
    let batch_during = done.load(SeqCst);
    stop.store(true, SeqCst);
    for flood in floods {
        flood.await.expect("flood");
    }
    (waits, batch_during, took)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_mode_serves_interactive_first_and_batch_keeps_going() {
    let provider = mock();
    let scheduler = common::isolated().upstream(config()).build().expect("scheduler");
    let llm = scheduler.upstream("llm").expect("configured");
    let (waits, batch, took) = mixed(std::slice::from_ref(&llm), std::slice::from_ref(&llm), provider.addr()).await;
    let waits_len = waits.len();
    let worst = p99(waits);
    eprintln!("local: interactive p99 permit wait {worst:?}; batch {batch} calls in {took:?}");
    // Without classes each interactive call would wait behind the whole batch queue (100
    // callers at 4 at a time: about a second).
    assert!(worst <= SERVICE * 3, "interactive p99 permit wait {worst:?} with {SERVICE:?} calls");
    // Interactive asks for far less than its share (one call per 50 ms): batch has the rest.
    assert_not_starved(batch, took, waits_len);
    assert!(provider.max_in_flight() <= LIMIT as usize, "the provider saw {} at once", provider.max_in_flight());
    let status = llm.status().await.expect("status");
    let names: Vec<_> = status.classes.iter().map(|c| (c.class.as_str(), c.weight)).collect();
    assert_eq!(names, [("interactive", 3), ("batch", 1)]);
}

/// 40 callers of each class call again and again for `secs` through `handles` (the callers
/// spread over them); returns the calls each class finished before the stop.
async fn both_flooding(handles: &[Upstream], addr: SocketAddr, secs: u64) -> (f64, f64) {
    let stop = Arc::new(AtomicBool::new(false));
    let counts = [Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0))];
    let floods = [("interactive", &counts[0]), ("batch", &counts[1])]
        .map(|(class, done)| flood_with(handles, addr, Who::class(class), 40, stop.clone(), done.clone()));
    tokio::time::sleep(Duration::from_secs(secs)).await;
    stop.store(true, SeqCst);
    for flood in floods {
        flood.await.expect("flood");
    }
    (counts[0].load(SeqCst) as f64, counts[1].load(SeqCst) as f64)
}

/// Who a flooding caller is: its class and its tenant (`None`: the upstream's defaults).
#[derive(Debug, Clone, Copy)]
struct Who {
    class: Option<&'static str>,
    tenant: Option<&'static str>,
}

impl Who {
    fn class(class: &'static str) -> Self {
        Self { class: Some(class), tenant: None }
    }
    #[cfg(feature = "redis")]
    fn tenant(tenant: &'static str) -> Self {
        Self { class: None, tenant: Some(tenant) }
    }
}

/// `callers` callers of `who` through `handles` (spread over them), each calling again as soon
/// as its call is done, until `stop`; counts in `done` the calls whose permit came before the
/// stop (not those still queued then: they drain one kind of caller alone).
fn flood_with(
    handles: &[Upstream],
    addr: SocketAddr,
    who: Who,
    callers: usize,
    stop: Arc<AtomicBool>,
    done: Arc<AtomicU64>,
) -> tokio::task::JoinHandle<()> {
    let handles = handles.to_vec();
    tokio::spawn(async move {
        let caller = |llm: Upstream| {
            let (stop, done) = (stop.clone(), done.clone());
            async move {
                while !stop.load(SeqCst) {
                    let mut request = llm.request();
                    if let Some(class) = who.class {
                        request = request.priority(class);
                    }
                    if let Some(tenant) = who.tenant {
                        request = request.tenant(tenant);
                    }
                    let reply = request
                        .call(|_| {
                            if !stop.load(SeqCst) {
                                done.fetch_add(1, SeqCst);
                            }
                            http_get(addr, "/", Duration::from_secs(5))
                        })
                        .await;
                    assert_eq!(reply.expect("a call").status, 200);
                }
            }
        };
        join_all((0..callers).map(|n| caller(handles[n % handles.len()].clone()))).await;
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_classes_flooding_share_the_limit_by_weight() {
    let provider = mock();
    let scheduler = common::isolated().upstream(config()).build().expect("scheduler");
    let llm = scheduler.upstream("llm").expect("configured");
    let (interactive, batch) = both_flooding(&[llm], provider.addr(), 3).await;
    let share = interactive / (interactive + batch);
    eprintln!("both flooding: interactive {interactive} calls, batch {batch}");
    // Weights 3 : 1 over a limit of 4: three permits for interactive, one for batch.
    assert!((0.65..=0.85).contains(&share), "interactive had {share:.2} of {} calls", interactive + batch);
    assert!(provider.max_in_flight() <= LIMIT as usize);
}

/// Weights 10 : 1 over a limit of 2 (a small limit, or a fallback's share): batch is not starved.
fn heavy_weights_small_limit() -> UpstreamConfig {
    UpstreamConfig::builder("llm")
        .limit(2)
        .max_wait(Duration::from_secs(30))
        .class("interactive", 10)
        .class("batch", 1)
        .build()
        .expect("valid config")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limit_smaller_than_the_weights_starves_no_class() {
    let provider = mock();
    let scheduler = common::isolated().upstream(heavy_weights_small_limit()).build().expect("scheduler");
    let llm = scheduler.upstream("llm").expect("configured");
    let (interactive, batch) = both_flooding(&[llm], provider.addr(), 2).await;
    eprintln!("limit 2, weights 10 : 1: interactive {interactive} calls, batch {batch}");
    // Its weighted share, 1 / 11 of the calls; comparing usage after a grant,
    // (in flight + 1) / weight, gave batch nothing here.
    let share = batch / (interactive + batch);
    assert!((0.05..=0.2).contains(&share), "batch made {batch} of {} calls", interactive + batch);
    assert!(provider.max_in_flight() <= 2);
}

#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limit_smaller_than_the_weights_starves_no_class_across_the_fleet() {
    let redis = wavegate_testkit::RedisServer::start().expect("redis-server");
    let provider = mock();
    let schedulers: Vec<Scheduler> = (0..2)
        .map(|_| {
            Scheduler::builder().upstream(heavy_weights_small_limit()).redis(redis.url()).build().expect("scheduler")
        })
        .collect();
    let handles: Vec<Upstream> = schedulers.iter().map(|s| s.upstream("llm").expect("configured")).collect();
    let (interactive, batch) = both_flooding(&handles, provider.addr(), 3).await;
    eprintln!("shared, limit 2, weights 10 : 1: interactive {interactive} calls, batch {batch}");
    let share = batch / (interactive + batch);
    assert!((0.05..=0.2).contains(&share), "batch made {batch} of {} calls", interactive + batch);
    assert!(provider.max_in_flight() <= 2, "the provider saw {} at once", provider.max_in_flight());
}

#[tokio::test]
async fn an_unknown_class_is_refused_before_any_wait() {
    let scheduler = common::isolated().upstream(config()).build().expect("scheduler");
    let llm = scheduler.upstream("llm").expect("configured");
    let refused = llm.request().priority("urgent").acquire().await.expect_err("no such class");
    assert_eq!((refused.kind(), refused.class()), (ErrorKind::UnknownClass, Some("urgent")), "{refused:?}");
    assert_eq!(refused.known_classes().map(<[String]>::len), Some(2), "{refused:?}");
    assert!(refused.to_string().contains("interactive, batch"), "{refused}");
}

#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_mode_interactive_first_across_the_fleet() {
    use wavegate::Mode;
    use wavegate_testkit::RedisServer;

    let redis = RedisServer::start().expect("redis-server");
    let provider = mock();
    let schedulers: Vec<Scheduler> = (0..4)
        .map(|_| Scheduler::builder().upstream(config()).redis(redis.url()).build().expect("scheduler"))
        .collect();
    for scheduler in &schedulers {
        assert_eq!(scheduler.mode().await.expect("mode"), Mode::Shared);
    }
    let handles: Vec<Upstream> = schedulers.iter().map(|s| s.upstream("llm").expect("configured")).collect();
    // The flood in two schedulers, the interactive calls in the two others.
    let (waits, batch, took) = mixed(&handles[..2], &handles[2..], provider.addr()).await;
    let waits_len = waits.len();
    let worst = p99(waits);
    eprintln!("shared: interactive p99 permit wait {worst:?}; batch {batch} calls in {took:?}");
    assert!(worst <= SERVICE * 3, "interactive p99 permit wait {worst:?} with {SERVICE:?} calls");
    assert_not_starved(batch, took, waits_len);
    assert!(provider.max_in_flight() <= LIMIT as usize, "the provider saw {} at once", provider.max_in_flight());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn within_a_class_one_tenants_flood_does_not_starve_another_tenant() {
    let provider = mock();
    let config = UpstreamConfig::builder("llm").limit(2).max_wait(Duration::from_secs(30)).build().expect("valid");
    let scheduler = common::isolated().upstream(config).build().expect("scheduler");
    let llm = scheduler.upstream("llm").expect("configured");
    let addr = provider.addr();
    let stop = Arc::new(AtomicBool::new(false));
    // Tenant "a" keeps 40 callers waiting at all times.
    let flood = {
        let (llm, stop) = (llm.clone(), stop.clone());
        tokio::spawn(async move {
            let caller = |llm: Upstream, stop: Arc<AtomicBool>| async move {
                while !stop.load(SeqCst) {
                    let reply = llm.request().tenant("a").call(|_| http_get(addr, "/", Duration::from_secs(5))).await;
                    assert_eq!(reply.expect("a call").status, 200);
                }
            };
            join_all((0..40).map(|_| caller(llm.clone(), stop.clone()))).await;
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    // Tenant "b" asks ten times, one after another.
    let mut waits = Vec::new();
    for _ in 0..10 {
        let mut waited = Duration::ZERO;
        let reply = llm
            .request()
            .tenant("b")
            .call(|attempt| {
                waited += attempt.waited;
                http_get(addr, "/", Duration::from_secs(5))
            })
            .await;
        assert_eq!(reply.expect("b's call").status, 200);
        waits.push(waited);
    }
    stop.store(true, SeqCst);
    flood.await.expect("flood");
    let worst = waits.iter().max().copied().unwrap_or_default();
    eprintln!("tenant b's longest permit wait: {worst:?} behind 40 of tenant a's callers");
    // Behind a's whole queue it would wait 40 / 2 x 40 ms = 800 ms.
    assert!(worst <= SERVICE * 3, "tenant b waited {worst:?} for a permit");
    assert!(provider.max_in_flight() <= 2);
    let status = llm.status().await.expect("status");
    assert_eq!(status.queue_depth, 0, "every waiter answered");
}

/// Tenants are fair across the fleet: at limit 2, tenant "a" floods from two schedulers and
/// tenant "b" from a third. Per process (each serving its own tenants, the processes of a class
/// taking turns) "b" would get a third of the calls; fleet-wide (the permit goes to the tenant
/// holding the fewest permits anywhere) it gets half.
#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenants_are_fair_across_the_fleet() {
    let redis = wavegate_testkit::RedisServer::start().expect("redis-server");
    let provider = mock();
    // Fleet-wide tenants take part in the choice of class, so the upstream has one.
    let config = || {
        UpstreamConfig::builder("llm")
            .limit(2)
            .max_wait(Duration::from_secs(30))
            .class("all", 1)
            .build()
            .expect("valid")
    };
    let schedulers: Vec<Scheduler> = (0..3)
        .map(|_| Scheduler::builder().upstream(config()).redis(redis.url()).build().expect("scheduler"))
        .collect();
    let addr = provider.addr();
    let stop = Arc::new(AtomicBool::new(false));
    let counts = [Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0))];
    let floods: Vec<_> = [(0, "a"), (1, "a"), (2, "b")]
        .into_iter()
        .map(|(n, tenant)| {
            let llm = schedulers[n].upstream("llm").expect("configured");
            let done = counts[usize::from(tenant == "b")].clone();
            flood_with(&[llm], addr, Who::tenant(tenant), 20, stop.clone(), done)
        })
        .collect();
    tokio::time::sleep(Duration::from_secs(3)).await;
    stop.store(true, SeqCst);
    for flood in floods {
        flood.await.expect("flood");
    }
    let (a, b) = (counts[0].load(SeqCst) as f64, counts[1].load(SeqCst) as f64);
    eprintln!("fleet-wide tenants: a (two schedulers) {a} calls, b (one) {b}");
    let share = b / (a + b);
    assert!((0.42..=0.58).contains(&share), "tenant b had {share:.2} of {} calls", a + b);
    assert!(provider.max_in_flight() <= 2, "the provider saw {} at once", provider.max_in_flight());
}

/// 600 requests a minute (10 a second, bursts of 6), batch capped at 25 % of it: 150 a minute,
/// bursts of 1.
fn batch_capped_at_a_quarter_of_the_budget() -> UpstreamConfig {
    UpstreamConfig::builder("llm")
        .limit(10)
        .max_wait(Duration::from_secs(30))
        .requests_per_minute(600, 6)
        .class("interactive", 1)
        .class("batch", 1)
        .class_budget("batch", 25)
        .build()
        .expect("valid config")
}

/// Batch alone for 2 s, then batch and interactive for 3 s: batch stays within its quarter
/// of the budget throughout, and interactive gets the rest.
async fn a_class_budget_caps_its_class(handles: &[Upstream], addr: SocketAddr) {
    let (batch, interactive) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let stop = Arc::new(AtomicBool::new(false));
    let batch_flood = flood_with(handles, addr, Who::class("batch"), 20, stop.clone(), batch.clone());
    tokio::time::sleep(Duration::from_secs(2)).await;
    let alone = batch.load(SeqCst);
    let interactive_flood = flood_with(handles, addr, Who::class("interactive"), 20, stop.clone(), interactive.clone());
    tokio::time::sleep(Duration::from_secs(3)).await;
    stop.store(true, SeqCst);
    batch_flood.await.expect("batch flood");
    interactive_flood.await.expect("interactive flood");
    let (batch, interactive) = (batch.load(SeqCst), interactive.load(SeqCst));
    eprintln!(
        "class budget: batch alone {alone} calls in 2 s; then batch {} and interactive {interactive} in 3 s",
        batch - alone
    );
    // Batch: a burst of 1 and 2.5 a second. Without its cap it would take the whole budget
    // (6 + 10 a second) while alone, and half of it with interactive.
    assert!(alone <= 7, "batch made {alone} calls alone in 2 s");
    assert!(batch - alone <= 9, "batch made {} calls in 3 s beside interactive", batch - alone);
    // Interactive: what batch leaves of the 10 a second, and the burst batch did not spend.
    assert!(interactive >= 20, "interactive made {interactive} calls in 3 s");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_class_budget_caps_its_class_in_local_mode() {
    let provider = mock();
    let scheduler = common::isolated().upstream(batch_capped_at_a_quarter_of_the_budget()).build().expect("scheduler");
    a_class_budget_caps_its_class(&[scheduler.upstream("llm").expect("configured")], provider.addr()).await;
}

#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_class_budget_caps_its_class_across_the_fleet() {
    let redis = wavegate_testkit::RedisServer::start().expect("redis-server");
    let provider = mock();
    let schedulers: Vec<Scheduler> = (0..2)
        .map(|_| {
            Scheduler::builder()
                .upstream(batch_capped_at_a_quarter_of_the_budget())
                .redis(redis.url())
                .build()
                .expect("scheduler")
        })
        .collect();
    let handles: Vec<Upstream> = schedulers.iter().map(|s| s.upstream("llm").expect("configured")).collect();
    a_class_budget_caps_its_class(&handles, provider.addr()).await;
}

#[test]
fn a_class_budget_without_a_budget_is_refused_with_what_to_change() {
    let error = UpstreamConfig::builder("llm")
        .class("batch", 1)
        .class_budget("batch", 50)
        .build()
        .expect_err("no budget to share");
    assert!(error.to_string().contains("set requests_per_minute or tokens_per_minute"), "{error}");
    let error = UpstreamConfig::builder("llm")
        .requests_per_minute(60, 1)
        .class("batch", 1)
        .class_budget("batch", 0)
        .build()
        .expect_err("0 %");
    assert!(error.to_string().contains("outside 1..=100"), "{error}");
}
