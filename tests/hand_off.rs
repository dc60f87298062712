//! The hand-off, through the public API: a release grants the freed permit to the ask the
//! process that waited longest left at the limit, in the same script call, and that process's
//! waiter takes it without an acquire of its own (`docs/redis.md`). Two schedulers (two
//! coordinators, as two processes would have) on one real redis-server.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use wavegate::{ErrorKind, Scheduler, UpstreamConfig};
use wavegate_testkit::RedisServer;

mod common;

fn upstream(limit: u32) -> UpstreamConfig {
    UpstreamConfig::builder("llm").limit(limit).max_wait(Duration::from_secs(10)).build().expect("valid config")
}

fn scheduler(redis: &RedisServer) -> Scheduler {
    Scheduler::builder().upstream(upstream(1)).redis(redis.url()).build().expect("scheduler")
}

fn permits_key(redis: &RedisServer) -> String {
    let name = wavegate::config::UpstreamName::new("llm").expect("name");
    wavegate::StoreConfig::new(redis.url()).keyspace.upstream(&name).permits
}

/// At limit 1, two processes whose callers ask again as soon as they release take turns: each
/// release hands the permit to the other process's waiter. A permit then costs its release and
/// the refused ask that puts the releasing process back on the list — two script calls, where
/// an acquire of the woken process made it three — and never more than one call is in flight.
#[actix::test]
async fn at_limit_one_each_release_hands_the_permit_to_the_other_process() {
    const ROUNDS: usize = 25;
    let redis = RedisServer::start().expect("redis-server");
    let (a, b) = (scheduler(&redis), scheduler(&redis));
    // Both connected, with their subscriptions made, before counting.
    for s in [&a, &b] {
        drop(s.upstream("llm").expect("configured").request().acquire().await.expect("a first permit"));
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut con = redis.client().get_connection().expect("connection");
    let before = common::script_calls(&mut con);
    let in_flight = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let turns = |s: &Scheduler| {
        let llm = s.upstream("llm").expect("configured");
        let (in_flight, most) = (in_flight.clone(), most.clone());
        async move {
            for _ in 0..ROUNDS {
                let permit = llm.request().acquire().await.expect("a permit");
                let now = in_flight.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(5)).await;
                in_flight.fetch_sub(1, Ordering::SeqCst);
                drop(permit);
            }
        }
    };
    tokio::join!(turns(&a), turns(&b));
    // The last releases land.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let calls = common::script_calls(&mut con) - before;
    let per_permit = calls as f64 / (2 * ROUNDS) as f64;
    println!("{calls} script calls for {} permits: {per_permit:.2} per permit", 2 * ROUNDS);
    assert_eq!(most.load(Ordering::SeqCst), 1, "more than one call at once under limit 1");
    // 2 per permit, and a little for the heartbeats and the first and last turns.
    assert!(per_permit <= 2.4, "{per_permit:.2} script calls per permit: the woken process asked for its permit");
}

/// A caller that gave up while its process waited leaves its ask at the store; the release that
/// hands it the permit finds nobody to take it, and the process gives it back at once, not when
/// its lease (3 s by default) ends.
#[actix::test]
async fn a_permit_handed_to_a_caller_that_left_is_given_back_at_once() {
    let redis = RedisServer::start().expect("redis-server");
    let (a, b) = (scheduler(&redis), scheduler(&redis));
    let (llm_a, llm_b) = (a.upstream("llm").expect("configured"), b.upstream("llm").expect("configured"));
    drop(llm_b.request().acquire().await.expect("b connected"));
    let held = llm_a.request().acquire().await.expect("a permit");
    let gone = llm_b.request().timeout(Duration::from_millis(150)).acquire().await;
    assert_eq!(gone.as_ref().map_err(|e| e.kind()).err(), Some(ErrorKind::DeadlinePassed), "{gone:?}");
    let mut con = redis.client().get_connection().expect("connection");
    let permits = permits_key(&redis);
    let card = |con: &mut redis::Connection| -> u64 { redis::cmd("ZCARD").arg(&permits).query(con).expect("ZCARD") };
    assert_eq!(card(&mut con), 1);
    drop(held);
    let deadline = Instant::now() + Duration::from_secs(1);
    while card(&mut con) != 0 {
        assert!(Instant::now() < deadline, "the permit handed to a caller that left is still held");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // And the next caller anywhere gets it.
    let next = tokio::time::timeout(Duration::from_secs(2), llm_a.request().acquire()).await;
    assert!(matches!(next, Ok(Ok(_))), "{next:?}");
}
