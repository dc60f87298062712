//! Changes of mode that keep their promises, in one process against a real redis-server: no
//! permit left behind by a command that ran after its reply was given up on, no cooldown
//! forgotten by a switch, heartbeats and waiting-list places that outlive a hiccup.

use std::time::{Duration, Instant};

use wavegate::{Mode, Scheduler, UpstreamConfig};
use wavegate_testkit::RedisServer;

/// A fixed lease long enough that a leaked permit would still be there at the end of a test.
fn fixed_lease(limit: u32) -> UpstreamConfig {
    UpstreamConfig::builder("llm")
        .limit(limit)
        .permit_ttl(Duration::from_secs(60))
        .call_timeout(Duration::from_secs(30))
        .max_wait(Duration::from_secs(5))
        .cooldown_ladder([Duration::from_secs(2)])
        .build()
        .expect("valid config")
}

async fn wait_for_mode(scheduler: &Scheduler, mode: Mode, within: Duration) -> Duration {
    let started = Instant::now();
    loop {
        if scheduler.mode().await.expect("mode") == mode {
            return started.elapsed();
        }
        assert!(started.elapsed() < within, "not in {mode} mode within {within:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn shared_members(redis: &RedisServer) -> Vec<String> {
    let mut con = redis.connection().expect("direct connection");
    redis::cmd("ZRANGE").arg("wavegate:{llm}:permits").arg(0).arg(-1).query(&mut con).expect("ZRANGE")
}

/// The phantom permit of the nemesis run: Redis hangs, a release times out first and switches
/// the process to fallback, the acquire sent just after it times out too and is dropped as
/// stale; the waiter is served locally under the same id and finishes during the outage. When
/// Redis resumes it runs the buffered acquire: unless its id is on the list of registrations to
/// drop, it holds a slot of the limit for the whole lease.
#[actix::test]
async fn an_acquire_in_flight_when_another_command_switches_to_fallback_leaves_no_phantom() {
    let mut redis = RedisServer::start().expect("redis-server");
    let scheduler = Scheduler::builder().upstream(fixed_lease(4)).redis(redis.url()).build().expect("scheduler");
    let held = scheduler.acquire("llm").await.expect("a permit while healthy");
    tokio::time::sleep(Duration::from_millis(100)).await; // the first heartbeat lands
    assert_eq!(shared_members(&redis), vec![held.id().to_string()]);

    redis.pause().expect("SIGSTOP");
    held.succeeded(); // its `finish` is sent first, so its timeout is the one that switches
    let permit = scheduler.acquire("llm").await.expect("a permit through the fallback");
    assert_eq!(scheduler.mode().await.expect("mode"), Mode::Fallback);
    let id = permit.id().to_string();
    permit.succeeded(); // finished during the outage
    tokio::time::sleep(Duration::from_millis(400)).await; // the stale acquire's timeout passes

    redis.resume().expect("SIGCONT: Redis runs the buffered acquire");
    wait_for_mode(&scheduler, Mode::Shared, Duration::from_secs(5)).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(shared_members(&redis), Vec::<String>::new(), "a phantom permit ({id}) holds a slot for the lease");
}

/// A release that fails for a reason other than an outage (here the wave's key has the wrong
/// type for a moment) is tried again, not forgotten until the lease ends.
#[actix::test]
async fn a_release_refused_by_the_store_is_tried_again() {
    let redis = RedisServer::start().expect("redis-server");
    let scheduler = Scheduler::builder().upstream(fixed_lease(4)).redis(redis.url()).build().expect("scheduler");
    let permit = scheduler.acquire("llm").await.expect("permit");
    let mut con = redis.connection().expect("direct connection");
    let wave: std::collections::HashMap<String, String> =
        redis::cmd("HGETALL").arg("wavegate:{llm}:wave").query(&mut con).expect("HGETALL");
    redis::cmd("DEL").arg("wavegate:{llm}:wave").exec(&mut con).expect("DEL");
    redis::cmd("SET").arg("wavegate:{llm}:wave").arg("not a hash").exec(&mut con).expect("SET");
    permit.succeeded(); // WRONGTYPE inside `finish`
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(scheduler.mode().await.expect("mode"), Mode::Shared, "a refused command is not an outage");
    redis::cmd("DEL").arg("wavegate:{llm}:wave").exec(&mut con).expect("DEL");
    let mut restore = redis::cmd("HSET");
    restore.arg("wavegate:{llm}:wave");
    for (field, value) in &wave {
        restore.arg(field).arg(value);
    }
    restore.exec(&mut con).expect("HSET");
    let deadline = Instant::now() + Duration::from_secs(2);
    while !shared_members(&redis).is_empty() {
        assert!(Instant::now() < deadline, "the refused release was never tried again");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
