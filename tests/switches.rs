//! Changes of mode that keep their promises, in one process against a real redis-server: no
//! permit left behind by a command that ran after its reply was given up on, no cooldown
//! forgotten by a switch, heartbeats and waiting-list places that outlive a hiccup.

use std::time::{Duration, Instant, SystemTime};

use wavegate::config::Recovery;
use wavegate::{Mode, Outcome, Scheduler, UpstreamConfig, WaveState};
use wavegate_testkit::RedisServer;
use wavegate_testkit::{Fault, FaultProxy};

mod common;
use common::wait_for_mode;

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
    let llm = scheduler.upstream("llm").expect("configured");
    let held = llm.request().acquire().await.expect("a permit while healthy");
    tokio::time::sleep(Duration::from_millis(100)).await; // the first heartbeat lands
    assert_eq!(shared_members(&redis), vec![held.id().to_string()]);

    redis.pause().expect("SIGSTOP");
    held.succeeded(); // its `finish` is sent first, so its timeout is the one that switches
    let permit = llm.request().acquire().await.expect("a permit through the fallback");
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
    let llm = scheduler.upstream("llm").expect("configured");
    let permit = llm.request().acquire().await.expect("permit");
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

/// An empty restart of Redis during a cooldown: the cooldown this process carried into the
/// fallback goes back into the shared wave, instead of the fleet starting again at the full
/// limit in NORMAL a moment after the restart.
#[actix::test]
async fn an_empty_restart_does_not_forget_a_running_cooldown() {
    let mut redis = RedisServer::start().expect("redis-server");
    let upstream = UpstreamConfig::builder("llm")
        .limit(4)
        .recovery(Recovery::Seed) // every 429 of the wave stops the fleet for a cooldown
        .max_wait(Duration::from_secs(2))
        .build()
        .expect("config");
    let scheduler = Scheduler::builder().upstream(upstream).redis(redis.url()).build().expect("scheduler");
    let llm = scheduler.upstream("llm").expect("configured");
    let permit = llm.request().acquire().await.expect("permit");
    permit.report(Outcome::from_status(429, Some("10"), SystemTime::now()));
    tokio::time::sleep(Duration::from_millis(100)).await;
    let cooling = llm.status().await.expect("status");
    assert_eq!((cooling.state, cooling.limit), (WaveState::Cooldown, 2), "{cooling:?}");

    redis.kill().expect("kill -9");
    wait_for_mode(&scheduler, Mode::Fallback, Duration::from_secs(3)).await;
    redis.restart().expect("restart, empty");
    wait_for_mode(&scheduler, Mode::Shared, Duration::from_secs(5)).await;
    let shared = llm.status().await.expect("status");
    assert_eq!(shared.state, WaveState::Cooldown, "the restart forgot the cooldown: {shared:?}");
    assert!(shared.limit <= 2, "the restart forgot the cut: {shared:?}");
    assert!(shared.cooldown_remaining >= Duration::from_secs(5), "{shared:?}");
    let started = Instant::now();
    let early = llm.request().acquire().await;
    assert!(early.is_err(), "granted {:?} after the restart, inside the 10 s cooldown", started.elapsed());
}

/// One upstream whose key the store refuses (WRONGTYPE) at the reconciliation: the others go
/// back to shared mode, and what the reconciled one used during the outage is charged once.
#[actix::test]
async fn one_upstream_the_store_refuses_does_not_keep_the_others_in_fallback() {
    let redis = RedisServer::start().expect("redis-server");
    let proxy = FaultProxy::start(redis.addr()).expect("fault proxy");
    let llm = UpstreamConfig::builder("llm")
        .limit(4)
        .requests_per_minute(6, 10)
        .max_wait(Duration::from_secs(2))
        .build()
        .expect("config");
    let img = UpstreamConfig::builder("img").limit(4).build().expect("config");
    let scheduler = Scheduler::builder().upstream(llm).upstream(img).redis(proxy.url()).build().expect("scheduler");
    let llm = scheduler.upstream("llm").expect("configured");
    llm.request().acquire().await.expect("permit").succeeded(); // 1 request charged in shared mode
    tokio::time::sleep(Duration::from_millis(100)).await;

    proxy.set_fault(Fault::BlackHole);
    for _ in 0..3 {
        llm.request().acquire().await.expect("a permit through the fallback").succeeded();
    }
    assert_eq!(scheduler.mode().await.expect("mode"), Mode::Fallback);
    let mut con = redis.connection().expect("direct connection");
    redis::cmd("SET").arg("wavegate:{img}:permits").arg("not a sorted set").exec(&mut con).expect("SET");
    proxy.set_fault(Fault::None);
    wait_for_mode(&scheduler, Mode::Shared, Duration::from_secs(5)).await;
    tokio::time::sleep(Duration::from_secs(2)).await; // more probes would charge again
    let status = llm.status().await.expect("status");
    let (remaining, _) = status.budgets.requests.expect("a requests budget");
    assert!((5..=7).contains(&remaining), "10 - 1 - 3 used during the outage should leave 6: {status:?}");
}

/// Two processes in wave 1; one's 429 cuts, the other's is late, and what that one learns
/// from the reply (a 10 s shared cooldown runs) is carried into its fallback when Redis then
/// goes away from it: it does not start again in NORMAL at its share.
#[actix::test]
async fn a_cooldown_learned_from_a_late_429_goes_on_in_the_fallback() {
    let redis = RedisServer::start().expect("redis-server");
    let proxy = FaultProxy::start(redis.addr()).expect("fault proxy");
    let upstream = || {
        let upstream = UpstreamConfig::builder("llm").limit(4).recovery(Recovery::Seed);
        upstream.max_wait(Duration::from_secs(1)).build().expect("config")
    };
    let a = Scheduler::builder().upstream(upstream()).redis(redis.url()).build().expect("scheduler");
    let llm_a = a.upstream("llm").expect("configured");
    let b = Scheduler::builder().upstream(upstream()).redis(proxy.url()).build().expect("scheduler");
    let llm_b = b.upstream("llm").expect("configured");
    let (pa, pb) = (llm_a.request().acquire().await.expect("permit"), llm_b.request().acquire().await.expect("permit"));
    pa.report(Outcome::from_status(429, Some("10"), SystemTime::now()));
    tokio::time::sleep(Duration::from_millis(100)).await;
    pb.report(Outcome::from_status(429, Some("10"), SystemTime::now())); // late: same wave
    tokio::time::sleep(Duration::from_millis(100)).await;

    proxy.set_fault(Fault::BlackHole);
    wait_for_mode(&b, Mode::Fallback, Duration::from_secs(3)).await;
    let status = llm_b.status().await.expect("status");
    assert_eq!(status.state, WaveState::Cooldown, "the shared cooldown was forgotten: {status:?}");
    let started = Instant::now();
    let early = llm_b.request().acquire().await;
    assert!(early.is_err(), "granted {:?} into a 10 s cooldown", started.elapsed());
}

/// A 429 of an older wave whose report fails (the store just went away) is late: it cuts
/// nothing locally and nothing is carried into the shared wave at the reconciliation.
#[actix::test]
async fn a_late_429_whose_report_failed_does_not_cut_again() {
    let redis = RedisServer::start().expect("redis-server");
    let proxy = FaultProxy::start(redis.addr()).expect("fault proxy");
    let upstream = UpstreamConfig::builder("llm")
        .limit(4)
        .recovery(Recovery::Seed)
        .cooldown_ladder([Duration::from_millis(500)])
        .min_cooldown(Duration::from_millis(100))
        .build()
        .expect("config");
    let scheduler = Scheduler::builder().upstream(upstream).redis(proxy.url()).build().expect("scheduler");
    let llm = scheduler.upstream("llm").expect("configured");
    let (first, second) =
        (llm.request().acquire().await.expect("permit"), llm.request().acquire().await.expect("permit"));
    first.report(Outcome::from_status(429, None, SystemTime::now())); // wave 1 → 2, cooldown 0.5 s
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(llm.status().await.expect("status").wave, 2);

    proxy.set_fault(Fault::BlackHole);
    second.report(Outcome::from_status(429, None, SystemTime::now())); // wave 1: late; its report times out
    wait_for_mode(&scheduler, Mode::Fallback, Duration::from_secs(2)).await;
    tokio::time::sleep(Duration::from_millis(800)).await; // the shared cooldown is over
    proxy.set_fault(Fault::None);
    wait_for_mode(&scheduler, Mode::Shared, Duration::from_secs(5)).await;
    let status = llm.status().await.expect("status");
    assert_eq!(status.wave, 2, "a late 429 started a new shared wave: {status:?}");
}

/// With an ACL user that has no channel rights, the release's `PUBLISH` is refused: the release
/// itself must still succeed, and this process's own waiter is served at once, not by its poll.
#[actix::test]
async fn a_release_without_channel_rights_still_wakes_the_local_waiter_at_once() {
    let redis = RedisServer::start().expect("redis-server");
    let mut con = redis.connection().expect("direct connection");
    redis::cmd("ACL")
        .arg("SETUSER")
        .arg("nochannels")
        .arg("on")
        .arg(">secret")
        .arg("~*")
        .arg("resetchannels")
        .arg("+@all")
        .exec(&mut con)
        .expect("ACL SETUSER");
    let url = format!("redis://nochannels:secret@127.0.0.1:{}/", redis.port());
    let upstream = UpstreamConfig::builder("llm").limit(1).build().expect("config");
    let scheduler = Scheduler::builder().upstream(upstream).redis(url).build().expect("scheduler");
    let llm = scheduler.upstream("llm").expect("configured");
    let held = llm.request().acquire().await.expect("permit");
    let waiter = {
        let llm = llm.clone();
        actix::spawn(async move {
            let permit = llm.request().acquire().await.expect("the waiter's permit");
            (Instant::now(), permit)
        })
    };
    tokio::time::sleep(Duration::from_millis(600)).await; // past the waiter's first poll
    let released = Instant::now();
    held.succeeded();
    let (granted, permit) = waiter.await.expect("waiter");
    let took = granted.duration_since(released);
    assert!(took < Duration::from_millis(100), "the waiter was served {took:?} after the release");
    permit.succeeded();
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(shared_members(&redis).is_empty(), "the release did not happen");
    assert_eq!(scheduler.mode().await.expect("mode"), Mode::Shared);
}

/// A process cut off from Redis for longer than a few heartbeats is still counted by the
/// others: when Redis then dies for them too, their fallback shares still add up to the limit.
#[actix::test]
async fn a_process_cut_off_for_a_while_still_counts_in_the_others_shares() {
    let mut redis = RedisServer::start().expect("redis-server");
    let proxy = FaultProxy::start(redis.addr()).expect("fault proxy");
    let upstream = || UpstreamConfig::builder("llm").limit(4).build().expect("config");
    let a = Scheduler::builder().upstream(upstream()).redis(redis.url()).build().expect("scheduler");
    let llm_a = a.upstream("llm").expect("configured");
    let b = Scheduler::builder().upstream(upstream()).redis(proxy.url()).build().expect("scheduler");
    let llm_b = b.upstream("llm").expect("configured");
    llm_a.request().acquire().await.expect("permit").succeeded();
    llm_b.request().acquire().await.expect("permit").succeeded();
    tokio::time::sleep(Duration::from_millis(1_200)).await; // both heartbeats seen by both

    proxy.set_fault(Fault::BlackHole);
    wait_for_mode(&b, Mode::Fallback, Duration::from_secs(3)).await;
    tokio::time::sleep(Duration::from_millis(4_500)).await; // longer than a few heartbeats
    redis.kill().expect("kill -9");
    wait_for_mode(&a, Mode::Fallback, Duration::from_secs(3)).await;
    let (sa, sb) = (llm_a.status().await.expect("status"), llm_b.status().await.expect("status"));
    assert!(sa.limit + sb.limit <= 4, "fallback shares {} + {} at limit 4", sa.limit, sb.limit);
}

/// The store forgetting who is live (an empty restart, a flush) while the other processes are
/// cut off: the one process still connected then counts only itself in its heartbeats, but the
/// others it saw live within a heartbeat's lifetime still count, so when Redis then goes away
/// for it too its fallback share is not the whole limit.
#[actix::test]
async fn a_store_that_forgets_the_live_processes_does_not_inflate_a_fallback_share() {
    let mut redis = RedisServer::start().expect("redis-server");
    let proxies: Vec<FaultProxy> = (0..3).map(|_| FaultProxy::start(redis.addr()).expect("fault proxy")).collect();
    let upstream = || UpstreamConfig::builder("llm").limit(4).build().expect("config");
    let a = Scheduler::builder().upstream(upstream()).redis(redis.url()).build().expect("scheduler");
    let llm_a = a.upstream("llm").expect("configured");
    let others: Vec<Scheduler> = proxies
        .iter()
        .map(|p| Scheduler::builder().upstream(upstream()).redis(p.url()).build().expect("scheduler"))
        .collect();
    for scheduler in std::iter::once(&a).chain(&others) {
        scheduler.upstream("llm").expect("configured").request().acquire().await.expect("permit").succeeded();
    }
    tokio::time::sleep(Duration::from_millis(1_200)).await; // every heartbeat seen by every process
    for proxy in &proxies {
        proxy.set_fault(Fault::BlackHole);
    }
    for scheduler in &others {
        wait_for_mode(scheduler, Mode::Fallback, Duration::from_secs(3)).await;
    }
    // The store forgets every process; only `a` writes its heartbeat again (it sees 1 live).
    let mut con = redis.connection().expect("connection");
    redis::cmd("FLUSHALL").exec(&mut con).expect("FLUSHALL");
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    redis.kill().expect("kill -9");
    wait_for_mode(&a, Mode::Fallback, Duration::from_secs(3)).await;
    let mut shares = vec![llm_a.status().await.expect("status").limit];
    for scheduler in &others {
        shares.push(scheduler.upstream("llm").expect("configured").status().await.expect("status").limit);
    }
    assert_eq!(shares[0], 1, "the connected process took a share of {} at limit 4 (shares {shares:?})", shares[0]);
    assert!(shares.iter().sum::<u32>() <= 4, "fallback shares {shares:?} at limit 4");
}

/// Fairness across processes: a process that has waited 11 s at the limit keeps its place on
/// the waiting list (it keeps asking) and is served before one that has waited 0.5 s.
#[actix::test]
async fn a_long_waiting_process_keeps_its_place_on_the_waiting_list() {
    let redis = RedisServer::start().expect("redis-server");
    let upstream =
        || UpstreamConfig::builder("llm").limit(1).max_wait(Duration::from_secs(20)).build().expect("config");
    let build = || Scheduler::builder().upstream(upstream()).redis(redis.url()).build().expect("scheduler");
    let (holder, patient, newcomer) = (build(), build(), build());
    let held = holder.upstream("llm").expect("configured").request().acquire().await.expect("permit");
    let wait = |scheduler: Scheduler| {
        actix::spawn(async move {
            let permit = scheduler.upstream("llm").expect("configured").request().acquire().await.expect("a permit");
            let granted = Instant::now();
            tokio::time::sleep(Duration::from_millis(50)).await;
            permit.succeeded();
            granted
        })
    };
    let patient = wait(patient);
    tokio::time::sleep(Duration::from_secs(11)).await;
    let newcomer = wait(newcomer);
    tokio::time::sleep(Duration::from_millis(500)).await;
    held.succeeded();
    let (patient, newcomer) = (patient.await.expect("patient"), newcomer.await.expect("newcomer"));
    assert!(patient < newcomer, "the process that waited 0.5 s was served before the one that waited 11 s");
}

/// The fallback's share of a requests budget starts with what this process used just before
/// the switch: a switch (or a store that flaps) does not hand out a fresh burst.
#[actix::test]
async fn a_switch_to_fallback_does_not_refill_the_budgets() {
    let redis = RedisServer::start().expect("redis-server");
    let proxy = FaultProxy::start(redis.addr()).expect("fault proxy");
    let upstream = UpstreamConfig::builder("llm")
        .limit(10)
        .requests_per_minute(60, 5)
        .max_wait(Duration::from_millis(400))
        .build()
        .expect("config");
    let scheduler = Scheduler::builder().upstream(upstream).redis(proxy.url()).build().expect("scheduler");
    let llm = scheduler.upstream("llm").expect("configured");
    for _ in 0..5 {
        llm.request().acquire().await.expect("the burst, in shared mode").succeeded();
    }
    proxy.set_fault(Fault::BlackHole);
    let mut granted = 0;
    for _ in 0..3 {
        if let Ok(permit) = llm.request().acquire().await {
            granted += 1;
            permit.succeeded();
        }
    }
    assert_eq!(scheduler.mode().await.expect("mode"), Mode::Fallback);
    assert!(granted <= 1, "{granted} requests granted at once in the fallback after the burst was spent");
}
