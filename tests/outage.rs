//! Redis outages in one process: a hang (SIGSTOP), a crash with an empty restart, a script
//! flush, a 429 seen during the outage, Redis down from the start, a tokens budget shared by a
//! large fleet.

use std::time::{Duration, Instant, SystemTime};

use wavegate::{Mode, Outcome, Scheduler, UpstreamConfig, WaveState};
use wavegate_testkit::RedisServer;

mod common;
use common::wait_for_mode;

fn upstream(limit: u32) -> UpstreamConfig {
    UpstreamConfig::builder("llm")
        .limit(limit)
        .renewed_lease(Duration::from_secs(3))
        .max_wait(Duration::from_secs(5))
        .cooldown_ladder([Duration::from_secs(2)])
        .build()
        .expect("valid config")
}

#[actix::test]
async fn a_hung_redis_costs_one_command_timeout_then_resumes() {
    let mut redis = RedisServer::start().expect("redis-server");
    let scheduler = Scheduler::builder().upstream(upstream(4)).redis(redis.url()).build().expect("scheduler");
    let llm = scheduler.upstream("llm").expect("configured");
    let held = llm.request().acquire().await.expect("a permit while healthy");
    // Let the first heartbeat land (it tells this process it is alone); pause() below blocks
    // this thread, which is also the scheduler's.
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(scheduler.mode().await.expect("mode"), Mode::Shared);

    redis.pause().expect("SIGSTOP");
    let started = Instant::now();
    let permit = llm.request().acquire().await.expect("a permit through the fallback");
    let took = started.elapsed();
    assert!(took < Duration::from_millis(250 + 350), "the acquire took {took:?} against a hung server");
    assert_eq!(scheduler.mode().await.expect("mode"), Mode::Fallback);
    // The fallback share is the whole limit for the only live process; both permits count.
    let status = llm.status().await.expect("status");
    assert_eq!((status.limit, status.in_flight_local), (4, 2));

    redis.resume().expect("SIGCONT");
    let back = wait_for_mode(&scheduler, Mode::Shared, Duration::from_secs(5)).await;
    println!("back in shared mode {back:?} after SIGCONT; the hung acquire took {took:?}");
    // Both permits are registered in the shared set.
    let mut con = redis.connection().expect("connection");
    let members: usize = redis::cmd("ZCARD").arg("wavegate:{llm}:permits").query(&mut con).expect("ZCARD");
    assert_eq!(members, 2);
    drop(held);
    permit.succeeded();
    let deadline = Instant::now() + Duration::from_secs(2);
    while redis::cmd("ZCARD").arg("wavegate:{llm}:permits").query::<usize>(&mut con).expect("ZCARD") != 0 {
        assert!(Instant::now() < deadline, "the releases after recovery did not reach the shared set");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[actix::test]
async fn a_crash_and_empty_restart_leave_exactly_the_permits_in_flight() {
    let mut redis = RedisServer::start().expect("redis-server");
    let scheduler = Scheduler::builder().upstream(upstream(6)).redis(redis.url()).build().expect("scheduler");
    let llm = scheduler.upstream("llm").expect("configured");
    let before = llm.request().acquire().await.expect("permit");
    let finished_during = llm.request().acquire().await.expect("permit");
    tokio::time::sleep(Duration::from_millis(100)).await; // the first heartbeat lands

    redis.kill().expect("kill -9");
    let during = llm.request().acquire().await.expect("a permit through the fallback");
    assert_eq!(scheduler.mode().await.expect("mode"), Mode::Fallback);
    finished_during.succeeded();
    tokio::time::sleep(Duration::from_millis(50)).await;

    redis.restart().expect("restart, empty");
    let back = wait_for_mode(&scheduler, Mode::Shared, Duration::from_secs(5)).await;
    println!("back in shared mode {back:?} after the restart");
    let mut con = redis.connection().expect("connection");
    let mut members: Vec<String> =
        redis::cmd("ZRANGE").arg("wavegate:{llm}:permits").arg(0).arg(-1).query(&mut con).expect("ZRANGE");
    members.sort();
    let mut expected = vec![before.id().to_string(), during.id().to_string()];
    expected.sort();
    assert_eq!(members, expected, "the shared set must hold exactly the permits still in flight");
}

#[actix::test]
async fn a_script_flush_under_load_is_not_an_outage() {
    let redis = RedisServer::start().expect("redis-server");
    let scheduler = Scheduler::builder().upstream(upstream(5)).redis(redis.url()).build().expect("scheduler");
    let llm = scheduler.upstream("llm").expect("configured");
    let mut callers = Vec::new();
    for _ in 0..20 {
        let llm = llm.clone();
        callers.push(actix::spawn(async move {
            let mut errors = 0;
            for _ in 0..15 {
                let result = llm
                    .request()
                    .call(|_| async {
                        tokio::time::sleep(Duration::from_millis(2)).await;
                        Ok::<_, Outcome>(())
                    })
                    .await;
                errors += usize::from(result.is_err());
            }
            errors
        }));
    }
    let mut saw_fallback = false;
    for _ in 0..5 {
        redis.flush_scripts().expect("SCRIPT FLUSH");
        for _ in 0..5 {
            saw_fallback |= scheduler.mode().await.expect("mode") != Mode::Shared;
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    let mut errors = 0;
    for caller in callers {
        errors += caller.await.expect("caller");
    }
    assert_eq!(errors, 0);
    assert!(!saw_fallback, "NOSCRIPT must reload the script, not switch to fallback");
}

#[actix::test]
async fn a_429_seen_during_the_outage_reaches_the_shared_wave() {
    let mut redis = RedisServer::start().expect("redis-server");
    // The seed's recovery, so that one 429 starts a cooldown (the default steps back first).
    let seed = UpstreamConfig::builder("llm")
        .limit(8)
        .renewed_lease(Duration::from_secs(3))
        .max_wait(Duration::from_secs(5))
        .cooldown_ladder([Duration::from_secs(2)])
        .recovery(wavegate::config::Recovery::Seed)
        .build()
        .expect("valid config");
    let scheduler = Scheduler::builder().upstream(seed).redis(redis.url()).build().expect("scheduler");
    let llm = scheduler.upstream("llm").expect("configured");
    llm.request().acquire().await.expect("permit").succeeded();
    redis.kill().expect("kill -9");
    let permit = llm.request().acquire().await.expect("a permit through the fallback");
    permit.report(Outcome::from_status(429, Some("3"), SystemTime::now()));
    tokio::time::sleep(Duration::from_millis(20)).await;
    let local = llm.status().await.expect("status");
    assert_eq!((local.mode, local.state), (Mode::Fallback, WaveState::Cooldown), "the fallback cools down too");

    redis.restart().expect("restart, empty");
    wait_for_mode(&scheduler, Mode::Shared, Duration::from_secs(5)).await;
    let shared = llm.status().await.expect("status");
    assert_eq!((shared.mode, shared.state, shared.limit), (Mode::Shared, WaveState::Cooldown, 4), "{shared:?}");
    assert!(shared.cooldown_remaining > Duration::from_secs(1), "the outage's cooldown goes on: {shared:?}");
}

#[actix::test]
async fn redis_down_from_the_start_falls_back_then_joins() {
    let mut redis = RedisServer::start().expect("redis-server");
    redis.kill().expect("kill -9: down before the scheduler starts");
    let scheduler = Scheduler::builder()
        .upstream(upstream(3))
        .redis(redis.url())
        .build()
        .expect("a scheduler builds without a reachable Redis");
    let llm = scheduler.upstream("llm").expect("configured");
    let started = Instant::now();
    llm.request()
        .call(|_| async { Ok::<_, Outcome>(()) })
        .await
        .expect("calls go through the fallback while Redis is down");
    assert!(started.elapsed() < Duration::from_secs(1), "took {:?}", started.elapsed());
    assert_eq!(scheduler.mode().await.expect("mode"), Mode::Fallback);
    // No heartbeat was ever read: the fleet's size is unknown, so this process takes one
    // permit, not the whole limit (ten processes starting during an outage must not send 10 ×).
    assert_eq!(llm.status().await.expect("status").limit, 1);
    redis.restart().expect("redis-server comes up");
    wait_for_mode(&scheduler, Mode::Shared, Duration::from_secs(5)).await;
}

#[actix::test]
async fn a_process_knows_its_fleet_from_its_build_on() {
    let mut redis = RedisServer::start().expect("redis-server");
    let build = || Scheduler::builder().upstream(upstream(4)).redis(redis.url()).build().expect("scheduler");
    let (_first, second) = (build(), build());
    // Redis goes away before any heartbeat of the engine: the startup check's counted both.
    redis.kill().expect("kill -9");
    let llm = second.upstream("llm").expect("configured");
    llm.request().call(|_| async { Ok::<_, Outcome>(()) }).await.expect("calls go on in fallback");
    assert_eq!(second.mode().await.expect("mode"), Mode::Fallback);
    assert_eq!(llm.status().await.expect("status").limit, 2, "the share of two processes, not of an unknown fleet");
}

#[actix::test]
async fn a_lost_acquire_reply_never_makes_a_second_permit() {
    use wavegate_testkit::{Fault, FaultProxy};
    let redis = RedisServer::start().expect("redis-server");
    let proxy = FaultProxy::start(redis.addr()).expect("fault proxy");
    let scheduler = Scheduler::builder().upstream(upstream(4)).redis(proxy.url()).build().expect("scheduler");
    let llm = scheduler.upstream("llm").expect("configured");
    // Connect first, so the armed fault takes the acquire and not the connection's handshake.
    llm.request().acquire().await.expect("permit").succeeded();
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(scheduler.mode().await.expect("mode"), Mode::Shared);

    proxy.set_fault(Fault::DropNextReply);
    let started = Instant::now();
    let permit = llm.request().acquire().await.expect("a permit despite the lost reply");
    let took = started.elapsed();
    let mut con = redis.connection().expect("direct connection");
    let members = |con: &mut redis::Connection| -> Vec<String> {
        redis::cmd("ZRANGE").arg("wavegate:{llm}:permits").arg(0).arg(-1).query(con).expect("ZRANGE")
    };
    assert_eq!(members(&mut con), vec![permit.id().to_string()], "the script ran although its reply was lost");
    assert!(took >= Duration::from_millis(200), "the reply should have been lost (took {took:?})");

    wait_for_mode(&scheduler, Mode::Shared, Duration::from_secs(5)).await;
    assert_eq!(members(&mut con), vec![permit.id().to_string()], "one permit, not two");
    permit.succeeded();
    let deadline = Instant::now() + Duration::from_secs(2);
    while !members(&mut con).is_empty() {
        assert!(Instant::now() < deadline, "the permit was not released");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn shared_members(redis: &RedisServer) -> Vec<String> {
    let mut con = redis.connection().expect("direct connection");
    redis::cmd("ZRANGE").arg("wavegate:{llm}:permits").arg(0).arg(-1).query(&mut con).expect("ZRANGE")
}

#[actix::test]
async fn a_release_lost_in_the_outage_is_dropped_on_recovery() {
    use wavegate_testkit::{Fault, FaultProxy};
    let redis = RedisServer::start().expect("redis-server");
    let proxy = FaultProxy::start(redis.addr()).expect("fault proxy");
    let scheduler = Scheduler::builder().upstream(upstream(4)).redis(proxy.url()).build().expect("scheduler");
    let llm = scheduler.upstream("llm").expect("configured");
    let permit = llm.request().acquire().await.expect("permit");
    assert_eq!(shared_members(&redis).await, vec![permit.id().to_string()]);

    proxy.set_fault(Fault::BlackHole);
    permit.succeeded(); // this release times out and switches the process to fallback
    wait_for_mode(&scheduler, Mode::Fallback, Duration::from_secs(2)).await;
    proxy.set_fault(Fault::None);
    wait_for_mode(&scheduler, Mode::Shared, Duration::from_secs(5)).await;
    assert!(shared_members(&redis).await.is_empty(), "the permit released during the outage still holds a slot");
}

#[actix::test]
async fn a_permit_whose_acquire_reply_was_lost_and_that_finished_in_the_outage_is_dropped() {
    use wavegate_testkit::{Fault, FaultProxy};
    let redis = RedisServer::start().expect("redis-server");
    let proxy = FaultProxy::start(redis.addr()).expect("fault proxy");
    let scheduler = Scheduler::builder().upstream(upstream(4)).redis(proxy.url()).build().expect("scheduler");
    let llm = scheduler.upstream("llm").expect("configured");
    llm.request().acquire().await.expect("permit").succeeded();
    tokio::time::sleep(Duration::from_millis(50)).await;

    proxy.set_fault(Fault::DropNextReply);
    let permit = llm.request().acquire().await.expect("a permit through the fallback");
    proxy.set_fault(Fault::BlackHole); // stay in fallback while the call finishes
    assert_eq!(scheduler.mode().await.expect("mode"), Mode::Fallback);
    assert_eq!(shared_members(&redis).await, vec![permit.id().to_string()], "the script ran");
    permit.succeeded();
    tokio::time::sleep(Duration::from_millis(50)).await;
    proxy.set_fault(Fault::None);
    wait_for_mode(&scheduler, Mode::Shared, Duration::from_secs(5)).await;
    assert!(shared_members(&redis).await.is_empty(), "the registration of a finished permit leaked");
}

#[actix::test]
async fn an_outage_at_full_rate_leaves_the_budget_empty_not_in_debt_for_the_outage() {
    // 10 requests a second, a burst of 10: the only process uses all of it through a 6 s outage.
    let mut redis = RedisServer::start().expect("redis-server");
    let config = UpstreamConfig::builder("llm")
        .limit(50)
        .requests_per_minute(600, 10)
        .max_wait(Duration::from_secs(20))
        .build()
        .expect("valid config");
    let scheduler = Scheduler::builder().upstream(config).redis(redis.url()).build().expect("scheduler");
    let llm = scheduler.upstream("llm").expect("configured");
    llm.request().acquire().await.expect("a permit while healthy").succeeded();
    tokio::time::sleep(Duration::from_millis(100)).await; // the first heartbeat lands
    redis.kill().expect("kill -9");
    let outage = Instant::now();
    let mut used = 0;
    while outage.elapsed() < Duration::from_secs(6) {
        llm.request().acquire().await.expect("a permit through the fallback").succeeded();
        used += 1;
    }
    redis.restart().expect("restart, empty");
    wait_for_mode(&scheduler, Mode::Shared, Duration::from_secs(5)).await;
    // What the outage used happened in the past at no more than the rate: it leaves the bucket
    // at most empty, so 5 more take about half a second — not the outage's 6 s over again.
    let back = Instant::now();
    for _ in 0..5 {
        llm.request().acquire().await.expect("a permit after the outage").succeeded();
    }
    let took = back.elapsed();
    println!("{used} requests in the 6 s outage; 5 more took {took:?} after it");
    assert!(used >= 50, "the fallback served {used} in 6 s at 10/s");
    assert!(took < Duration::from_secs(2), "the budget stalled {took:?} after the outage");
}

/// Puts `others` live instances besides this process on the heartbeat list, for 10 minutes.
fn pretend_a_fleet(redis: &RedisServer, others: usize) {
    let mut con = redis.connection().expect("connection");
    let (seconds, _): (u64, u64) = redis::cmd("TIME").query(&mut con).expect("TIME");
    for n in 0..others {
        let until = seconds * 1_000 + 600_000;
        redis::cmd("ZADD").arg("wavegate:instances").arg(until).arg(format!("other-{n}")).exec(&mut con).expect("ZADD");
    }
}

#[actix::test]
async fn in_a_large_fleets_fallback_an_estimate_above_the_share_is_admitted_at_the_shares_rate() {
    use wavegate::ErrorKind;
    let mut redis = RedisServer::start().expect("redis-server");
    // The figures: 20 processes, 200,000 tokens a minute, bursts of 16,000: each share
    // has 10,000 a minute and a burst of 800, and a call of 4,000 tokens is 24 s of it.
    let llm_config = UpstreamConfig::builder("llm")
        .limit(40)
        .tokens_per_minute(200_000, 16_000)
        .max_wait(Duration::from_secs(2))
        .build()
        .expect("valid config");
    // The same at 12 × the rate, to watch the pace: 2,000 tokens a second a share, 2 s a call.
    let fast_config = UpstreamConfig::builder("fast")
        .limit(40)
        .tokens_per_minute(2_400_000, 16_000)
        .max_wait(Duration::from_secs(10))
        .build()
        .expect("valid config");
    pretend_a_fleet(&redis, 19);
    let scheduler =
        Scheduler::builder().upstream(llm_config).upstream(fast_config).redis(redis.url()).build().expect("scheduler");
    redis.kill().expect("kill -9");
    let (llm, fast) = (scheduler.upstream("llm").expect("llm"), scheduler.upstream("fast").expect("fast"));

    // Each share's bucket is full: 4,000 tokens are admitted at once, into 24 s of debt.
    let started = Instant::now();
    llm.request().tokens(4_000).acquire().await.expect("4,000 tokens in fallback").succeeded();
    assert!(started.elapsed() < Duration::from_secs(1), "admitted after {:?}", started.elapsed());
    assert_eq!(scheduler.mode().await.expect("mode"), Mode::Fallback);
    assert_eq!(llm.status().await.expect("status").limit, 2, "the share of 20 processes");
    // The next waits for the debt, not refused as never fitting: 24 s, more than it may wait.
    let error = llm.request().tokens(4_000).acquire().await.expect_err("the share's rate");
    println!("the second call of 4,000: {error}; retry after {:?}", error.retry_after());
    assert_ne!(error.kind(), ErrorKind::InsufficientCapacity, "{error}");
    assert!(error.is_retryable(), "{error}");
    // Above the fleet's own burst: never fits, as in shared mode.
    let error = llm.request().tokens(16_001).acquire().await.expect_err("never fits");
    assert_eq!((error.kind(), error.burst()), (ErrorKind::InsufficientCapacity, Some(16_000)), "{error}");

    // The pace: three callers of 4,000 tokens for 7 s get one call each 2 s (at 0, 2, 4, 6 s).
    let started = Instant::now();
    let grants = std::sync::Arc::new(parking_lot::Mutex::new(Vec::new()));
    let mut callers = Vec::new();
    for _ in 0..3 {
        let (fast, grants) = (fast.clone(), grants.clone());
        callers.push(actix::spawn(async move {
            while started.elapsed() < Duration::from_secs(7) {
                match fast.request().tokens(4_000).acquire().await {
                    Ok(permit) => {
                        grants.lock().push(started.elapsed());
                        permit.succeeded();
                    }
                    Err(error) => {
                        assert_ne!(error.kind(), ErrorKind::InsufficientCapacity, "{error}");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                }
            }
        }));
    }
    for caller in callers {
        caller.await.expect("caller");
    }
    let grants = grants.lock().clone();
    println!("grants of 4,000 tokens at {grants:?}");
    // (Callers still waiting at 7 s are served after it, at the same pace.)
    let within = grants.iter().filter(|at| **at < Duration::from_secs(7)).count();
    assert!((3..=4).contains(&within), "one a 2 s in 7 s, not {within}: {grants:?}");
    for pair in grants.windows(2) {
        let gap = pair[1] - pair[0];
        assert!(gap >= Duration::from_millis(1_950), "faster than the share allows: {gap:?} in {grants:?}");
    }
}
