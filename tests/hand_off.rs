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

/// Limit 1, a fixed lease of a minute (call timeout 5 s): a permit left in a gate by nobody
/// stays there for that minute.
fn fixed_lease() -> UpstreamConfig {
    UpstreamConfig::builder("llm")
        .limit(1)
        .call_timeout(Duration::from_secs(5))
        .permit_ttl(Duration::from_secs(60))
        .max_wait(Duration::from_secs(10))
        .build()
        .expect("valid config")
}

/// Local mode, two schedulers of one process sharing the upstream's in-process gate (same key
/// prefix). B waits at the limit (its caller gives up), then B stops. A's release must leave
/// the permit free for A's next caller — not hand it to B's last ask, which nobody takes.
/// (Outside an actix system: each scheduler's actors run on a thread of their own, which its
/// drop stops, as at a process's exit.)
#[tokio::test]
async fn local_a_permit_is_not_handed_to_a_scheduler_that_stopped() {
    let prefix = format!("hand-off-local-{}", std::process::id());
    let a = Scheduler::builder().key_prefix(&prefix).upstream(fixed_lease()).build().expect("a");
    let b = Scheduler::builder().key_prefix(&prefix).upstream(fixed_lease()).build().expect("b");
    let llm_a = a.upstream("llm").expect("configured");
    let held = llm_a.request().acquire().await.expect("a permit");
    let gone = b.upstream("llm").expect("configured").request().timeout(Duration::from_millis(150)).acquire().await;
    assert!(gone.is_err(), "b is at the limit: {gone:?}");
    drop(b);
    tokio::time::sleep(Duration::from_millis(300)).await;
    drop(held);
    let next = tokio::time::timeout(Duration::from_secs(3), llm_a.request().acquire()).await;
    assert!(matches!(next, Ok(Ok(_))), "the freed permit went to a stopped scheduler's ask: {next:?}");
}

/// Shared mode: the same with two processes on Redis (B stops while on the waiting list).
#[tokio::test]
async fn shared_a_permit_is_not_handed_to_a_process_that_stopped() {
    let redis = RedisServer::start().expect("redis-server");
    let a = Scheduler::builder().upstream(fixed_lease()).redis(redis.url()).build().expect("a");
    let b = Scheduler::builder().upstream(fixed_lease()).redis(redis.url()).build().expect("b");
    let llm_a = a.upstream("llm").expect("configured");
    drop(b.upstream("llm").expect("configured").request().acquire().await.expect("b connected"));
    let held = llm_a.request().acquire().await.expect("a permit");
    let gone = b.upstream("llm").expect("configured").request().timeout(Duration::from_millis(150)).acquire().await;
    assert!(gone.is_err(), "b is at the limit: {gone:?}");
    b.shutdown().await;
    drop(b);
    tokio::time::sleep(Duration::from_millis(300)).await;
    drop(held);
    let next = tokio::time::timeout(Duration::from_secs(3), llm_a.request().acquire()).await;
    assert!(matches!(next, Ok(Ok(_))), "the freed permit went to a stopped process's ask: {next:?}");
}

/// The minimal user of docs/redis.md without its channel rights (supported: "a user without the
/// channel pattern or publish builds, with a warning"): no wake-up is delivered (PUBLISH fails
/// inside pcall), so no permit is handed, and a freed permit is not held for a caller that left.
#[actix::test]
async fn without_channel_rights_a_permit_handed_to_a_caller_that_left_is_not_lost() {
    let redis = RedisServer::start().expect("redis-server");
    let doc = include_str!("../docs/redis.md");
    let start = doc.find("ACL SETUSER wavegate on >secret ").expect("documented");
    let block = &doc[start..];
    let block = &block[..block.find("```").expect("block ends")];
    let rules: Vec<&str> = block.split_whitespace().skip(4).filter(|r| !r.starts_with('&')).collect();
    {
        let mut con = redis.connection().expect("connection");
        let mut command = redis::cmd("ACL");
        command.arg("SETUSER").arg("app").arg("reset").arg(">pw").arg("on");
        for rule in rules {
            command.arg(rule);
        }
        command.exec(&mut con).expect("ACL SETUSER");
    }
    let url = format!("redis://app:pw@127.0.0.1:{}/", redis.port());
    let a = Scheduler::builder().upstream(fixed_lease()).redis(url.clone()).build().expect("a");
    let b = Scheduler::builder().upstream(fixed_lease()).redis(url).build().expect("b");
    let (llm_a, llm_b) = (a.upstream("llm").expect("configured"), b.upstream("llm").expect("configured"));
    drop(llm_b.request().acquire().await.expect("b connected"));
    let held = llm_a.request().acquire().await.expect("a permit");
    let gone = llm_b.request().timeout(Duration::from_millis(150)).acquire().await;
    assert!(gone.is_err(), "b is at the limit: {gone:?}");
    drop(held);
    let next = tokio::time::timeout(Duration::from_secs(3), llm_a.request().acquire()).await;
    assert!(matches!(next, Ok(Ok(_))), "the permit handed to b's departed caller holds the limit: {next:?}");
}

/// Shadow mode, local mode with two schedulers sharing the in-process gate, limit 1: B's ghost
/// is refused at the limit (its call went at once and met a 429 — a provider busier than
/// enforcing would have let it be), then handed A's freed permit. A ghost that waited does not
/// teach the wave its 429 ("from a 429 or a failure only when the ghost was granted at once"):
/// a handed permit is never granted at once.
#[actix::test]
async fn shadow_a_handed_ghost_that_waited_does_not_teach_the_wave_its_429() {
    let prefix = format!("hand-off-shadow-{}", std::process::id());
    let config = || UpstreamConfig::builder("llm").limit(1).shadow(true).build().expect("config");
    let a = Scheduler::builder().key_prefix(&prefix).upstream(config()).build().expect("a");
    let b = Scheduler::builder().key_prefix(&prefix).upstream(config()).build().expect("b");
    let (llm_a, llm_b) = (a.upstream("llm").expect("configured"), b.upstream("llm").expect("configured"));
    let pass_a = llm_a.request().acquire().await.expect("pass a");
    assert!(pass_a.is_shadow());
    tokio::time::sleep(Duration::from_millis(20)).await;
    let pass_b = llm_b.request().acquire().await.expect("pass b");
    assert!(pass_b.is_shadow());
    // B's call met a 429 while A's ran; B's ghost waits for the permit A's ghost holds.
    pass_b.report(wavegate::Outcome::rate_limited(None));
    tokio::time::sleep(Duration::from_millis(60)).await;
    pass_a.succeeded();
    // The ghosts are done well before B's at-limit poll (250-500 ms) would have asked again.
    tokio::time::sleep(Duration::from_millis(600)).await;
    let status = llm_b.status().await.expect("status");
    assert_eq!(status.shadow.waiting, 0, "{:?}", status.shadow);
    assert_eq!(status.state, wavegate::WaveState::Normal, "a waited ghost's 429 cut the wave: {status:?}");
}
