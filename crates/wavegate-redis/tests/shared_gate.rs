//! The shared gate on a real redis-server: idempotent ids, releases of unknown ids, leases,
//! pub/sub wake-ups, script flushes, odd state, and how outages are reported.

use std::time::{Duration, Instant};

use futures_util::StreamExt;
use wavegate_core::{Admission, DenyReason, OutageUsage, Recovery, UpstreamConfig, WaveSignal, WaveState};
use wavegate_redis::{SharedGate, Store, StoreConfig, WakeMessage};
use wavegate_testkit::RedisServer;

const LEASE: Duration = Duration::from_secs(30);

async fn gate(server: &RedisServer, name: &str, limit: u32) -> SharedGate {
    gate_with(server, UpstreamConfig::builder(name).limit(limit)).await
}

/// A gate whose every 429 of the current wave stops the fleet (the seed's recovery), for the
/// tests about cooldowns.
async fn seed_gate(server: &RedisServer, name: &str, limit: u32) -> SharedGate {
    gate_with(server, UpstreamConfig::builder(name).limit(limit).recovery(Recovery::Seed)).await
}

async fn gate_with(server: &RedisServer, builder: wavegate_core::UpstreamConfigBuilder) -> SharedGate {
    let upstream = builder.build().expect("valid config");
    let store = Store::connect(StoreConfig::new(server.url())).await.expect("store");
    SharedGate::new(store, upstream.name(), upstream.wave())
}

fn granted_wave(admission: Admission) -> u64 {
    match admission {
        Admission::Granted { wave, .. } => wave,
        denied => panic!("expected a grant, got {denied:?}"),
    }
}

#[tokio::test]
async fn a_resent_acquire_is_the_same_permit() {
    let server = RedisServer::start().expect("redis-server");
    let gate = gate(&server, "resend", 2).await;
    let first = gate.acquire_text("req-1", LEASE, 0).await.expect("acquire");
    let again = gate.acquire_text("req-1", LEASE, 0).await.expect("acquire again");
    assert_eq!(first.admission, again.admission);
    assert_eq!(again.in_flight, 1, "the resent acquire must not add a second permit");
    let mut con = server.connection().expect("connection");
    let members: i64 = redis::cmd("ZCARD").arg(&gate.keys().permits).query(&mut con).expect("ZCARD");
    assert_eq!(members, 1);
}

#[tokio::test]
async fn releasing_an_unknown_id_breaks_nothing() {
    let server = RedisServer::start().expect("redis-server");
    let gate = gate(&server, "unknown", 1).await;
    let wave = granted_wave(gate.acquire_text("held", LEASE, 0).await.expect("acquire").admission);
    let ghost = gate.finish_text("never-acquired", wave, WaveSignal::Neutral, 0).await.expect("finish ghost");
    assert!(!ghost.held);
    assert_eq!(ghost.status.in_flight, 1, "the held permit is still held");
    let done = gate.finish_text("held", wave, WaveSignal::Success, 0).await.expect("finish");
    assert!(done.held);
    let twice = gate.finish_text("held", wave, WaveSignal::Success, 0).await.expect("finish twice");
    assert!(!twice.held);
    assert_eq!(twice.status.in_flight, 0);
    assert!(matches!(gate.acquire_text("next", LEASE, 0).await.expect("acquire").admission, Admission::Granted { .. }));
}

#[tokio::test]
async fn fifty_simultaneous_429s_of_one_wave_cut_once() {
    let server = RedisServer::start().expect("redis-server");
    let gate = seed_gate(&server, "burst", 50).await;
    let mut waves = Vec::new();
    for i in 0..50 {
        waves.push(granted_wave(gate.acquire_text(&format!("p{i}"), LEASE, 0).await.expect("acquire").admission));
    }
    let reports = futures_join_all(&gate, &waves).await;
    let cuts =
        reports.iter().filter(|f| matches!(f.rate_limit, Some(wavegate_core::RateLimitEffect::Cut { .. }))).count();
    let late =
        reports.iter().filter(|f| matches!(f.rate_limit, Some(wavegate_core::RateLimitEffect::Late { .. }))).count();
    assert_eq!((cuts, late), (1, 49));
    let status = gate.status().await.expect("status");
    assert_eq!((status.state, status.limit, status.wave, status.in_flight), (WaveState::Cooldown, 25, 2, 0));
    // Nothing is issued during the cooldown.
    match gate.acquire_text("during", LEASE, 0).await.expect("acquire").admission {
        Admission::Denied { reason: DenyReason::Cooldown, retry_after_ms } => {
            assert!(retry_after_ms > 4_000 && retry_after_ms <= 5_000, "{retry_after_ms}");
        }
        other => panic!("granted during COOLDOWN: {other:?}"),
    }
}

/// Sends the 429s concurrently on one multiplexed connection.
async fn futures_join_all(gate: &SharedGate, waves: &[u64]) -> Vec<wavegate_redis::Finished> {
    let mut tasks = tokio::task::JoinSet::new();
    for (i, wave) in waves.iter().copied().enumerate() {
        let gate = gate.clone();
        tasks.spawn(async move {
            gate.finish_text(&format!("p{i}"), wave, WaveSignal::RateLimited { retry_after: None }, 0)
                .await
                .expect("finish")
        });
    }
    tasks.join_all().await
}

#[tokio::test]
async fn leases_end_and_renewals_extend_them() {
    let server = RedisServer::start().expect("redis-server");
    let gate = gate(&server, "lease", 3).await;
    let short = Duration::from_millis(300);
    gate.acquire_text("kept", short, 0).await.expect("acquire");
    gate.acquire_text("dropped", short, 0).await.expect("acquire");
    gate.acquire_text("lost", short, 0).await.expect("acquire");
    let mut con = server.connection().expect("connection");
    // The store loses one registration (a failover to a lagging replica, an eviction, ...).
    let _: () = redis::cmd("ZREM").arg(&gate.keys().permits).arg("lost").query(&mut con).expect("ZREM");
    tokio::time::sleep(Duration::from_millis(200)).await;
    let ids = ["kept".to_string(), "lost".to_string()];
    let again = gate.renew_text(&ids, Duration::from_millis(600)).await.expect("renew");
    assert_eq!(again, vec!["lost".to_string()], "the lost permit's call is still running: it is registered again");
    tokio::time::sleep(Duration::from_millis(200)).await;
    let status = gate.status().await.expect("status");
    assert_eq!(status.in_flight, 2, "the renewed permits survive, the other expired");
    let mut waves: Vec<String> = redis::cmd("HKEYS").arg(&gate.keys().permit_waves).query(&mut con).expect("HKEYS");
    waves.sort();
    assert_eq!(waves, vec!["kept".to_string(), "lost".to_string()], "expired permits leave no wave tag behind");
    assert!(gate.renew_text(&[], short).await.expect("empty renew").is_empty());
}

#[tokio::test]
async fn a_release_wakes_the_process_that_waited_longest() {
    // Permit ids as the engine makes them (a hand-off reads its id back).
    const F: &str = "first-waiter:1";
    const S: &str = "second-waiter:1";
    let server = RedisServer::start().expect("redis-server");
    let holder = gate(&server, "pubsub", 1).await;
    let first = gate(&server, "pubsub", 1).await.for_instance("first-waiter");
    let second = gate(&server, "pubsub", 1).await.for_instance("second-waiter");
    let mut pubsub = server.client().get_async_pubsub().await.expect("pubsub");
    // Each process hears only its own channel; the holder's stays silent.
    pubsub.subscribe(&first.wake_channel()).await.expect("subscribe");
    pubsub.subscribe(&second.wake_channel()).await.expect("subscribe");
    pubsub.subscribe(&holder.wake_channel()).await.expect("subscribe");
    let wave = granted_wave(holder.acquire_text("a", LEASE, 0).await.expect("acquire").admission);
    assert!(matches!(first.acquire_text(F, LEASE, 0).await.expect("acquire").admission, Admission::Denied { .. }));
    tokio::time::sleep(Duration::from_millis(5)).await;
    assert!(matches!(second.acquire_text(S, LEASE, 0).await.expect("acquire").admission, Admission::Denied { .. }));
    holder.finish_text("ghost", wave, WaveSignal::Neutral, 0).await.expect("finish ghost");
    holder.finish_text("a", wave, WaveSignal::Success, 0).await.expect("finish");
    let mut messages = pubsub.on_message();
    let message = tokio::time::timeout(Duration::from_secs(2), messages.next())
        .await
        .expect("a release message within 2 s")
        .expect("stream open");
    let payload: String = message.get_payload().expect("payload");
    assert_eq!(
        message.get_channel_name(),
        first.wake_channel().as_str(),
        "the process that waited longest is woken, on its own channel, and only on a real release"
    );
    // The release granted it its ask in the same step (the hand-off): the message says so.
    let woken = WakeMessage::parse(&payload);
    assert_eq!(woken.upstream, "pubsub", "{payload}");
    let handed = woken.handed.unwrap_or_else(|| panic!("a grant in {payload:?}"));
    assert_eq!((handed.id.as_str(), handed.wave, handed.state, handed.limit), (F, wave, WaveState::Normal, 1));
    // Asking again with the same id (a lost message) is the same permit, not a second one.
    let again = first.acquire_text(F, LEASE, 0).await.expect("acquire");
    assert_eq!((granted_wave(again.admission), again.in_flight), (wave, 1));
    // The next release hands the second one its ask.
    first.finish_text(F, wave, WaveSignal::Success, 0).await.expect("finish");
    let message = tokio::time::timeout(Duration::from_secs(2), messages.next()).await.expect("message").expect("open");
    assert_eq!(message.get_channel_name(), second.wake_channel(), "then the second one, on its channel");
    let handed = WakeMessage::parse(&message.get_payload::<String>().expect("payload")).handed.expect("a grant");
    assert_eq!(handed.id.as_str(), S);
    // Nothing else was published: two releases, two deliveries.
    assert!(
        tokio::time::timeout(Duration::from_millis(200), messages.next()).await.is_err(),
        "one delivery per release"
    );
}

#[tokio::test]
async fn a_script_flush_is_not_an_outage() {
    let server = RedisServer::start().expect("redis-server");
    let gate = gate(&server, "flush", 3).await;
    gate.acquire_text("a", LEASE, 0).await.expect("acquire");
    server.flush_scripts().expect("SCRIPT FLUSH");
    let acquired = gate.acquire_text("b", LEASE, 0).await.expect("acquire after a flush reloads the script");
    assert_eq!(acquired.in_flight, 2);
}

#[tokio::test]
async fn an_unreadable_state_starts_over_instead_of_failing() {
    let server = RedisServer::start().expect("redis-server");
    let gate = gate(&server, "odd", 4).await;
    let mut con = server.connection().expect("connection");
    let _: () = redis::cmd("HSET")
        .arg(&gate.keys().wave)
        .arg("state")
        .arg("EXPLODED")
        .arg("limit")
        .arg("not-a-number")
        .query(&mut con)
        .expect("HSET");
    let status = gate.status().await.expect("status");
    assert_eq!((status.state, status.limit, status.wave), (WaveState::Normal, 4, 1));
    let _: () = redis::cmd("HSET").arg(&gate.keys().wave).arg("limit").arg(999).query(&mut con).expect("HSET");
    let _: () = redis::cmd("HSET")
        .arg(&gate.keys().wave)
        .arg("state")
        .arg("NORMAL")
        .arg("wave")
        .arg(3)
        .arg("cooldown_until")
        .arg(0)
        .arg("successes")
        .arg(0)
        .arg("step")
        .arg(0)
        .arg("threshold")
        .arg(2)
        .query(&mut con)
        .expect("HSET");
    let status = gate.status().await.expect("status");
    assert_eq!((status.limit, status.wave), (4, 3), "a limit above the base is clamped to it");
}

#[tokio::test]
async fn scripts_check_their_arguments() {
    let server = RedisServer::start().expect("redis-server");
    let mut con = server.connection().expect("connection");
    let source = concat!(
        include_str!("../../../lua/wave.lua"),
        "\n",
        include_str!("../../../lua/priority.lua"),
        "\n",
        include_str!("../../../lua/acquire.lua")
    );
    let err =
        redis::cmd("EVAL").arg(source).arg(3).arg("a").arg("b").arg("c").arg("only-one").exec(&mut con).unwrap_err();
    assert!(err.to_string().contains("expected 23 ARGV, or classes after them, got 1"), "{err}");
    let err = redis::cmd("EVAL")
        .arg(source)
        .arg(3)
        .arg(&["a", "b", "c"][..])
        .arg(
            &[
                "10", "3", "5000", "1000", "60000", "0", "0", "0", "0", "seed", "1000", "8000", "32", "", "", "", "",
                "", "id", "-5", "0", "", "",
            ][..],
        )
        .exec(&mut con)
        .unwrap_err();
    assert!(err.to_string().contains("lease must be a non-negative integer"), "{err}");
}

#[tokio::test]
async fn outages_are_reported_fast_and_recovered_from() {
    let mut server = RedisServer::start().expect("redis-server");
    let gate = gate(&server, "outage", 3).await;
    gate.acquire_text("a", LEASE, 0).await.expect("acquire");

    // A hang: the command timeout (250 ms) bounds the call.
    server.pause().expect("SIGSTOP");
    let started = Instant::now();
    let err = gate.acquire_text("b", LEASE, 0).await.expect_err("a paused server cannot answer");
    let took = started.elapsed();
    assert!(err.is_outage() && err.is_timeout(), "{err:?}");
    assert!(took < Duration::from_millis(600), "took {took:?}");
    server.resume().expect("SIGCONT");
    gate.acquire_text("b", LEASE, 0).await.expect("works again after SIGCONT");

    // A death: refused connections are outages too, and quick.
    server.kill().expect("kill -9");
    for _ in 0..3 {
        let started = Instant::now();
        let err = gate.acquire_text("c", LEASE, 0).await.expect_err("a dead server cannot answer");
        assert!(err.is_outage(), "{err:?}");
        assert!(started.elapsed() < Duration::from_millis(800), "took {:?}", started.elapsed());
    }
    server.restart().expect("restart");
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match gate.acquire_text("c", LEASE, 0).await {
            Ok(acquired) => {
                assert_eq!(acquired.in_flight, 1, "a restarted server has no data");
                break;
            }
            Err(err) if err.is_state_lost() => {
                // Back, but empty: the state this gate saw is gone. The engine reconciles (its
                // fallback, then the probe); so does this test, and then it is served again.
                gate.reconcile(&[], &[], LEASE, OutageUsage::NONE).await.expect("reconcile");
            }
            Err(err) => {
                assert!(err.is_outage(), "{err:?}");
                assert!(Instant::now() < deadline, "no reconnect within 5 s: {err}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

#[tokio::test]
async fn reconcile_adopts_what_is_in_flight_and_drops_what_finished() {
    let server = RedisServer::start().expect("redis-server");
    let gate = gate(&server, "reconcile", 2).await;
    gate.acquire_text("finished-during-outage", LEASE, 0).await.expect("acquire");
    gate.acquire_text("still-running", LEASE, 0).await.expect("acquire");
    let adopt = vec!["still-running".to_string(), "granted-during-outage".to_string()];
    let reconciled = gate
        .reconcile(&adopt, &["finished-during-outage".to_string()], LEASE, OutageUsage::NONE)
        .await
        .expect("reconcile");
    assert_eq!((reconciled.wave, reconciled.in_flight), (1, 2));
    let mut con = server.connection().expect("connection");
    let mut members: Vec<String> =
        redis::cmd("ZRANGE").arg(&gate.keys().permits).arg(0).arg(-1).query(&mut con).expect("ZRANGE");
    members.sort();
    assert_eq!(members, vec!["granted-during-outage".to_string(), "still-running".to_string()]);
    // Adopted permits are ordinary permits afterwards: over the limit now, so nothing new is granted.
    assert!(matches!(gate.acquire_text("new", LEASE, 0).await.expect("acquire").admission, Admission::Denied { .. }));
    let done =
        gate.finish_text("granted-during-outage", reconciled.wave, WaveSignal::Success, 0).await.expect("finish");
    assert!(done.held);
}

#[tokio::test]
async fn heartbeats_count_live_instances() {
    let server = RedisServer::start().expect("redis-server");
    let store = Store::connect(StoreConfig::new(server.url())).await.expect("store");
    assert_eq!(store.heartbeat("a", Duration::from_millis(300)).await.expect("heartbeat"), 1);
    assert_eq!(store.heartbeat("b", Duration::from_millis(300)).await.expect("heartbeat"), 2);
    assert_eq!(store.heartbeat("a", Duration::from_millis(300)).await.expect("heartbeat"), 2);
    tokio::time::sleep(Duration::from_millis(350)).await;
    assert_eq!(store.heartbeat("a", Duration::from_millis(300)).await.expect("heartbeat"), 1, "b stopped beating");
}

#[tokio::test]
async fn each_process_tells_its_mode_with_its_heartbeat() {
    let server = RedisServer::start().expect("redis-server");
    let store = Store::connect(StoreConfig::new(server.url())).await.expect("store");
    let (ttl, turn) = (Duration::from_millis(400), Duration::from_millis(300));
    let beat = |instance: &'static str, mode: Option<(&'static str, &'static str)>| {
        let store = store.clone();
        async move { store.beat(instance, ttl, turn, mode).await.expect("heartbeat") }
    };
    let now = || async {
        let (secs, micros): (u64, u64) = store.query("TIME", redis::cmd("TIME")).await.expect("TIME");
        secs * 1_000 + micros / 1_000
    };
    let modes = || async {
        let processes = wavegate_redis::live_processes(&store, now().await).await.expect("processes");
        processes.into_iter().map(|p| (p.instance, p.mode)).collect::<Vec<_>>()
    };
    let first = beat("a", Some(("shared", ""))).await;
    assert!(first.gauge_reader, "a mode is not taken for the gauge reader's turn");
    beat("b", None).await;
    assert_eq!(modes().await, [("a".to_owned(), Some("shared".to_owned())), ("b".to_owned(), None)]);
    // A new mode replaces the one told before; live counts only processes.
    let again = beat("a", Some(("fallback 1/2", "shared"))).await;
    assert_eq!(again.live, 2, "a mode is not a live process");
    assert_eq!(modes().await[0], ("a".to_owned(), Some("fallback 1/2".to_owned())));
    let members: Vec<String> = store
        .query("ZRANGE", redis::cmd("ZRANGE").arg(store.config().keyspace.instances()).arg(0).arg(-1).clone())
        .await
        .expect("ZRANGE");
    assert_eq!(members.iter().filter(|m| m.starts_with("mode:a|")).count(), 1, "{members:?}");
    // a stops beating: its mode goes with it, at the next heartbeat that tells one.
    tokio::time::sleep(Duration::from_millis(450)).await;
    beat("b", Some(("shared", ""))).await;
    assert_eq!(modes().await, [("b".to_owned(), Some("shared".to_owned()))]);
    let members: Vec<String> = store
        .query("ZRANGE", redis::cmd("ZRANGE").arg(store.config().keyspace.instances()).arg(0).arg(-1).clone())
        .await
        .expect("ZRANGE");
    assert!(!members.iter().any(|m| m.starts_with("mode:a|")), "a's mode was removed: {members:?}");
}

#[tokio::test]
async fn one_process_at_a_time_reads_the_gauges_and_another_takes_over_when_it_stops() {
    let server = RedisServer::start().expect("redis-server");
    let store = Store::connect(StoreConfig::new(server.url())).await.expect("store");
    let (ttl, turn) = (Duration::from_secs(30), Duration::from_millis(300));
    let beat = |instance: &'static str| {
        let store = store.clone();
        async move { store.beat(instance, ttl, turn, None).await.expect("heartbeat") }
    };
    let first = beat("a").await;
    assert_eq!((first.live, first.gauge_reader), (1, true), "the first to beat reads");
    let second = beat("b").await;
    assert_eq!((second.live, second.gauge_reader), (2, false), "the reader's entry is not a live process");
    assert_eq!(store.heartbeat("c", ttl).await.expect("heartbeat"), 3, "a process may stay out of the choice");
    for _ in 0..3 {
        tokio::time::sleep(Duration::from_millis(150)).await;
        assert!(beat("a").await.gauge_reader, "a reader that keeps beating keeps its turn");
        assert!(!beat("b").await.gauge_reader, "one reader at a time");
    }
    // a stops (killed, paused): its turn ends, and the next to beat takes over.
    tokio::time::sleep(Duration::from_millis(350)).await;
    assert!(beat("b").await.gauge_reader, "b takes over once a's turn has ended");
    let back = beat("a").await;
    assert_eq!((back.live, back.gauge_reader), (3, false), "a, back, does not take it back");
}

#[tokio::test]
async fn a_raised_configured_limit_takes_effect() {
    let server = RedisServer::start().expect("redis-server");
    let small = gate(&server, "grown", 2).await;
    small.acquire_text("a", LEASE, 0).await.expect("acquire");
    small.finish_text("a", 1, WaveSignal::Success, 0).await.expect("finish");
    let large = gate(&server, "grown", 20).await;
    for i in 0..20 {
        let acquired = large.acquire_text(&format!("p{i}"), LEASE, 0).await.expect("acquire");
        assert!(matches!(acquired.admission, Admission::Granted { limit: 20, .. }), "{i}: {acquired:?}");
    }
}

#[tokio::test]
async fn permits_adopted_during_a_cooldown_cannot_cut_the_same_burst_again() {
    let server = RedisServer::start().expect("redis-server");
    let gate = seed_gate(&server, "adopted", 10).await;
    let wave = granted_wave(gate.acquire_text("a", LEASE, 0).await.expect("acquire").admission);
    gate.finish_text("a", wave, WaveSignal::RateLimited { retry_after: None }, 0).await.expect("429");
    let reconciled = gate.reconcile(&["x".to_string()], &[], LEASE, OutageUsage::NONE).await.expect("reconcile");
    assert_eq!((reconciled.state, reconciled.wave, reconciled.adopted_wave), (WaveState::Cooldown, 2, 1));
    let late = gate
        .finish_text("x", reconciled.adopted_wave, WaveSignal::RateLimited { retry_after: None }, 0)
        .await
        .expect("a late 429 of the adopted call");
    assert!(matches!(late.rate_limit, Some(wavegate_core::RateLimitEffect::Late { .. })), "{late:?}");
    assert_eq!((late.status.limit, late.status.wave), (5, 2), "one burst, one cut");
}

#[tokio::test]
async fn the_startup_check_counts_the_live_processes_this_one_included() {
    let server = RedisServer::start().expect("redis-server");
    let store = Store::connect(StoreConfig::new(server.url())).await.expect("store");
    let gates = [gate(&server, "check", 2).await];
    let first = store.check(&gates, "process-a", LEASE).await.expect("check");
    assert_eq!(first.live, 1, "{first:?}");
    let second = store.check(&gates, "process-b", LEASE).await.expect("check");
    assert_eq!(second.live, 2, "the first process's heartbeat is kept: {second:?}");
    let again = store.check(&gates, "process-b", LEASE).await.expect("check");
    assert_eq!(again.live, 2, "a process is counted once: {again:?}");
}

/// `lua/heartbeat.lua` as the processes of the version before the modes run it (commit
/// 0f83668): a fleet being upgraded, or rolled back, runs both side by side.
const OLD_HEARTBEAT: &str = include_str!("heartbeat_0_1.lua");

#[tokio::test]
async fn a_process_of_the_version_before_takes_the_gauge_reader_turn_a_newer_one_left() {
    // A new process beats with its mode, reads the gauges, then stops (a rollback). The older
    // processes left must elect a reader among them once its turn ends: its mode member must
    // not read, to their script, as a reader's turn that never ends.
    let server = RedisServer::start().expect("redis-server");
    let store = Store::connect(StoreConfig::new(server.url())).await.expect("store");
    let (ttl, turn) = (Duration::from_millis(400), Duration::from_millis(300));
    let new = store.beat("a", ttl, turn, Some(("shared", ""))).await.expect("heartbeat");
    assert!(new.gauge_reader);
    let mut con = server.connection().expect("connection");
    let instances = store.config().keyspace.instances();
    let old_beat = |con: &mut redis::Connection| -> (u32, u32) {
        let reply: Vec<u32> = redis::cmd("EVAL")
            .arg(OLD_HEARTBEAT)
            .arg(1)
            .arg(&instances)
            .arg("old")
            .arg(ttl.as_millis() as u64)
            .arg(turn.as_millis() as u64)
            .query(con)
            .expect("the old heartbeat");
        (reply[0], reply[1])
    };
    assert_eq!(old_beat(&mut con), (2, 0), "a reads while it beats");
    // a stops; the old process beats on.
    let stopped = Instant::now();
    loop {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let (live, reader) = old_beat(&mut con);
        if reader == 1 {
            assert_eq!(live, 1);
            break;
        }
        assert!(stopped.elapsed() < Duration::from_secs(3), "no reader elected 3 s after the new one stopped");
    }
}

#[tokio::test]
async fn a_mark_from_before_the_state_was_lost_does_not_measure_the_new_count() {
    // The count of grants (pw_sent_*) lives in the state's hash, the marks in the permit waves
    // hash: when only the state is lost (an eviction of that key, a `DEL` by hand), the count
    // starts over while a permit still running keeps its mark. Once the new count has passed
    // it, the old mark would be read as "nothing granted since": the report of that permit's
    // answer would take off nothing for the calls granted after it.
    use wavegate_core::{WindowLeft, WindowReport};
    let requests = |left| WindowReport { requests: Some(WindowLeft::fixed(left, 60_000)), ..WindowReport::default() };
    let server = RedisServer::start().expect("redis-server");
    let gate = gate(&server, "marks", 100).await;
    gate.report_window("", requests(1_000), 0).await.expect("a first report starts the count");
    for i in 1..=5 {
        let id = format!("p{i}");
        let wave = granted_wave(gate.acquire_text(&id, LEASE, 0).await.expect("acquire").admission);
        if i < 5 {
            gate.finish_text(&id, wave, WaveSignal::Success, 0).await.expect("finish");
        }
    }
    // p5 still runs (its mark: 5 grants); the state's hash is lost.
    let mut con = server.connection().expect("connection");
    redis::cmd("DEL").arg(&gate.keys().wave).exec(&mut con).expect("DEL");
    let lost = gate.acquire_text("q0", LEASE, 0).await;
    assert!(lost.is_err(), "the lost state is noticed: {lost:?}");
    gate.reconcile(&["p5".to_owned()], &[], LEASE, OutageUsage::NONE).await.expect("reconcile adopts p5");
    gate.report_window("", requests(1_000), 0).await.expect("the count starts over");
    for i in 1..=5 {
        granted_wave(gate.acquire_text(&format!("q{i}"), LEASE, 0).await.expect("acquire").admission);
    }
    // p5's answer: 10 left as of its admission; q1..q5 came after it.
    let windows = gate.report_window("p5", requests(10), 0).await.expect("p5's report");
    assert!(windows.requests.left <= 5, "the grants after p5 are taken off: {} left", windows.requests.left);
}

#[tokio::test]
async fn hostile_turn_and_mark_values_read_back_are_bounded() {
    // What the budget turn and the provider windows read back from the state (a value written
    // by hand, a backward jump of TIME, another version) never fails a script or holds
    // anything longer than the documented clamps: a turn at most its horizon ahead (2 s, and
    // the step), at most 64 in line, a mark or a count that cannot be read is no mark.
    use wavegate_core::{WindowLeft, WindowReport};
    const MOST_AHEAD_MS: u64 = wavegate_core::TURN_HORIZON_MS + 2 * wavegate_core::TURN_STEP_MS;
    let server = RedisServer::start().expect("redis-server");
    let config = UpstreamConfig::builder("hostile").limit(100).tokens_per_minute(60_000, 1_000).build().expect("valid");
    let store = || async { Store::connect(StoreConfig::new(server.url())).await.expect("store") };
    let a = SharedGate::for_upstream(store().await, &config).for_instance("a");
    granted_wave(a.acquire_text("A0", LEASE, 0).await.expect("acquire").admission);
    let mut con = server.connection().expect("connection");
    let mut line: String = (0..10_000).map(|i| format!("x{i}:5,")).collect();
    line.push_str(";;,:,é:1,a::3,b:-4,c:1e999,d:99999999999999999999999");
    redis::cmd("HSET")
        .arg(&a.keys().wave)
        .arg("turn_instance")
        .arg("zz")
        .arg("turn_at")
        .arg("1e999")
        .arg("turn_line")
        .arg(&line)
        .arg("pw_sent_requests")
        .arg("-5")
        .arg("pw_sent_tokens")
        .arg("garbage")
        .exec(&mut con)
        .expect("HSET");
    match a.acquire_text("A1", LEASE, 0).await.expect("acquire").admission {
        Admission::Denied { reason: DenyReason::EarlierWaiter, retry_after_ms } => {
            assert!(retry_after_ms <= MOST_AHEAD_MS, "a turn lies at most its horizon ahead: {retry_after_ms} ms");
        }
        other => panic!("zz holds the turn: {other:?}"),
    }
    let kept: String = redis::cmd("HGET").arg(&a.keys().wave).arg("turn_line").query(&mut con).expect("HGET");
    assert!(kept.split(',').count() <= 64, "the line keeps at most 64: {}", kept.split(',').count());
    // The turn given back by hand; a mark that cannot be read is no mark.
    redis::cmd("HSET").arg(&a.keys().wave).arg("turn_instance").arg("").exec(&mut con).expect("HSET");
    granted_wave(a.acquire_text("A2", LEASE, 0).await.expect("acquire").admission);
    for garbage in ["", "x:1:2", "1:2", "-1:0:0", "1e999:0:0", "99999999999999999999999:0:0"] {
        redis::cmd("HSET").arg(&a.keys().permit_waves).arg("m|A2").arg(garbage).exec(&mut con).expect("HSET");
        let report = WindowReport { requests: Some(WindowLeft::fixed(10, 60_000)), ..WindowReport::default() };
        let windows = a.report_window("A2", report, 0).await.expect("a report never fails on a garbage mark");
        assert!(windows.requests.left <= 10, "{garbage:?}: {} left", windows.requests.left);
    }
}

/// How many times Redis ran `command` (scripts' calls included), from `INFO commandstats`.
fn command_calls(con: &mut redis::Connection, command: &str) -> u64 {
    let info: String = redis::cmd("INFO").arg("commandstats").query(con).expect("INFO");
    let prefix = format!("cmdstat_{command}:calls=");
    info.lines()
        .find_map(|line| line.strip_prefix(&prefix))
        .and_then(|rest| rest.split(',').next())
        .map_or(0, |calls| calls.parse().expect("a count"))
}

#[tokio::test]
async fn an_acquire_reads_the_state_in_one_hmget_with_the_budget_turn() {
    // wave.lua reads every field of the state hash a script may need in one HMGET (its
    // STATE_FIELDS); the budget turn, read on every grant of a process with a name, must not
    // add a second one.
    let server = RedisServer::start().expect("redis-server");
    let config = UpstreamConfig::builder("reads").limit(100).tokens_per_minute(60_000, 1_000).build().expect("valid");
    let store = Store::connect(StoreConfig::new(server.url())).await.expect("store");
    let a = SharedGate::for_upstream(store, &config).for_instance("a");
    granted_wave(a.acquire_text("A0", LEASE, 0).await.expect("acquire").admission);
    let mut con = server.connection().expect("connection");
    let before = command_calls(&mut con, "hmget");
    for i in 1..=10 {
        granted_wave(a.acquire_text(&format!("A{i}"), LEASE, 1).await.expect("acquire").admission);
    }
    let per_acquire = (command_calls(&mut con, "hmget") - before) as f64 / 10.0;
    assert!(per_acquire <= 1.0, "{per_acquire} HMGET per acquire");
}
