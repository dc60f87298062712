//! Redis behind Sentinel: `kill -9` of the primary under load from four real processes.
//!
//! A primary, a replica and three sentinels (`wavegate-testkit`'s `SentinelGroup`); four
//! worker processes share one upstream (limit 10) through the primary the sentinels name; the
//! primary is killed 200 ms after it stopped replicating, so the promoted replica lacks
//! the last writes (permits granted and released just before). Each process falls back to its fair share (10 ÷ 4 = 2), asks the
//! sentinels for the primary again at every probe, finds the promoted replica once the
//! sentinels have failed over, and reconciles with it: it registers again every permit it
//! holds (the replica may lack the last writes), then shares again. The mock upstream counts
//! the calls it serves at once.
//!
//! This binary is its own worker (`WAVEGATE_SENTINEL_ROLE=worker`); `harness = false`.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use wavegate::{Scheduler, UpstreamConfig};
use wavegate_testkit::{MockUpstream, MockUpstreamConfig, SentinelGroup};

mod common;
use common::{Worker, call_until, env, field, run_scenarios};

const ROLE: &str = "WAVEGATE_SENTINEL_ROLE";
const PROCESSES: usize = 4;
const LIMIT: usize = 10;
/// Permits the holder takes just before the kill: writes the promoted replica lacks.
const HELD: usize = 2;
/// What the three callers may have at once at the mock during the outage: each its fair
/// share, 10 ÷ 4 = 2 (the holder's share is taken by its own permits).
const CALLER_SHARES: usize = (PROCESSES - 1) * (LIMIT / PROCESSES);

fn main() {
    if std::env::var(ROLE).is_ok() {
        worker_main();
        return;
    }
    let scenarios: [(&str, fn()); 3] = [
        ("a_dead_and_a_hung_sentinel_delay_nothing", a_dead_and_a_hung_sentinel_delay_nothing),
        ("a_sentinel_that_names_a_replica_is_not_written_to", a_sentinel_that_names_a_replica_is_not_written_to),
        (
            "kill_9_of_the_primary_under_load_fails_over_without_over_admitting",
            kill_9_of_the_primary_under_load_fails_over_without_over_admitting,
        ),
    ];
    run_scenarios(&scenarios);
}

/// The sentinels listed first are a dead one and a hung one (it accepts connections and never
/// answers): every question to the sentinels still gets its answer from a live one at once,
/// so the scheduler builds, shares, and a probe is not held by the hung sentinel's bound.
fn a_dead_and_a_hung_sentinel_delay_nothing() {
    let mut group = SentinelGroup::start().expect("primary, replica and three sentinels");
    let hung = std::net::TcpListener::bind("127.0.0.1:0").expect("a listener that never answers");
    let mut sentinels = vec![hung.local_addr().expect("addr").to_string()];
    sentinels.extend(group.sentinel_addresses());
    group.sentinels()[0].kill().expect("kill a sentinel");
    let system = actix::System::new();
    system.block_on(async {
        let upstream = UpstreamConfig::builder("mock").limit(2).build().expect("config");
        let started = Instant::now();
        let scheduler = Scheduler::builder()
            .upstream(upstream)
            .redis_sentinel(SentinelGroup::MASTER, sentinels)
            .build()
            .expect("scheduler");
        let built = started.elapsed();
        for _ in 0..20 {
            scheduler.upstream("mock").expect("configured").request().acquire().await.expect("permit").succeeded();
        }
        let served = started.elapsed();
        let health = scheduler.store_health().expect("a store");
        println!("    built in {built:?} (the startup check included), 20 permits by {served:?}; {health:?}");
        // Asked in turn, the hung sentinel would take each question's whole bound (750 ms): the
        // startup check's HELLO and every command would time out, and the process fall back.
        assert_eq!(scheduler.mode().await.expect("mode"), wavegate::Mode::Shared);
        assert!(health.server.is_some(), "the startup check reached the primary");
        let primary = group.primary().port();
        assert_eq!(health.primary, Some(format!("127.0.0.1:{primary}")));
    });
}

/// A sentinel that names `port` on 127.0.0.1 as the primary of every master (a stale answer,
/// as during a failover), and answers `+OK` to anything else; on a thread of its own.
fn stale_sentinel(port: u16) -> String {
    use std::io::{BufRead, BufReader, Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a listener");
    let address = listener.local_addr().expect("addr").to_string();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            std::thread::spawn(move || {
                let mut writer = stream.try_clone().expect("clone");
                let mut reader = BufReader::new(stream);
                let mut line = String::new();
                // One command: `*N` then N bulk strings (`$len`, the bytes).
                while reader.read_line(&mut line).is_ok_and(|n| n > 0) {
                    let count: usize = line.trim().trim_start_matches('*').parse().unwrap_or(0);
                    let mut words = Vec::new();
                    for _ in 0..count {
                        line.clear();
                        let _ = reader.read_line(&mut line);
                        let len: usize = line.trim().trim_start_matches('$').parse().unwrap_or(0);
                        let mut word = vec![0; len + 2];
                        let _ = reader.read_exact(&mut word);
                        words.push(String::from_utf8_lossy(&word[..len]).to_uppercase());
                    }
                    line.clear();
                    let reply = if words.iter().any(|w| w == "GET-MASTER-ADDR-BY-NAME") {
                        let port = port.to_string();
                        format!("*2\r\n$9\r\n127.0.0.1\r\n${}\r\n{port}\r\n", port.len())
                    } else {
                        "+OK\r\n".to_string()
                    };
                    if writer.write_all(reply.as_bytes()).is_err() {
                        return;
                    }
                }
            });
        }
    });
    address
}

/// A sentinel whose answer is stale names the replica (made writable here, so writes there
/// would succeed): the `ROLE` check refuses it, and the process runs on its fallback share
/// rather than sharing permits on a server the fleet does not share.
fn a_sentinel_that_names_a_replica_is_not_written_to() {
    let mut group = SentinelGroup::start().expect("primary, replica and three sentinels");
    let replica = group.replica().port();
    let mut con = group.replica().connection().expect("connection");
    redis::cmd("CONFIG").arg("SET").arg("replica-read-only").arg("no").exec(&mut con).expect("CONFIG SET");
    let sentinels = vec![stale_sentinel(replica)];
    let system = actix::System::new();
    system.block_on(async {
        let upstream = UpstreamConfig::builder("mock").limit(2).build().expect("config");
        let scheduler = Scheduler::builder()
            .upstream(upstream)
            .redis_sentinel(SentinelGroup::MASTER, sentinels)
            .build()
            .expect("scheduler");
        let permit = scheduler.upstream("mock").expect("configured").request().acquire().await.expect("permit");
        permit.succeeded();
        let mode = scheduler.mode().await.expect("mode");
        println!("    mode with a sentinel naming the replica: {mode:?}");
        assert_ne!(mode, wavegate::Mode::Shared, "shared permits on a replica");
    });
    let keys: Vec<String> = redis::cmd("KEYS").arg("wavegate:*").query(&mut con).expect("KEYS");
    assert!(keys.is_empty(), "wavegate wrote to the replica: {keys:?}");
}

/// The most calls the mock served at once at any instant of `[from, to)`.
fn max_in_flight(spans: &[(Instant, Instant)], from: Instant, to: Instant) -> usize {
    let mut events: Vec<(Instant, i32)> = spans.iter().flat_map(|(start, end)| [(*start, 1), (*end, -1)]).collect();
    // Ends before starts at the same instant: a call that ended is not counted with the next.
    events.sort_by_key(|&(at, delta)| (at, delta));
    let (mut now, mut most) = (0i32, 0i32);
    for (at, delta) in events {
        now += delta;
        if at >= from && at < to {
            most = most.max(now);
        }
    }
    most as usize
}

fn kill_9_of_the_primary_under_load_fails_over_without_over_admitting() {
    let mut group = SentinelGroup::start().expect("primary, replica and three sentinels");
    let mock =
        MockUpstream::start(MockUpstreamConfig { service_time: Duration::from_millis(20), ..Default::default() })
            .expect("mock upstream");
    let envs = [
        ("SENTINELS", group.sentinel_addresses().join(",")),
        ("MASTER", SentinelGroup::MASTER.to_string()),
        ("MOCK_ADDR", mock.addr().to_string()),
        ("LIMIT", LIMIT.to_string()),
        ("CALLERS", "8".to_string()),
        ("DURATION_MS", "14000".to_string()),
    ];
    let mut holder = Worker::spawn(ROLE, &[&envs[..], &[("WORK", "hold".to_string())]].concat());
    let workers: Vec<Worker> =
        (1..PROCESSES).map(|_| Worker::spawn(ROLE, &[&envs[..], &[("WORK", "calls".to_string())]].concat())).collect();
    for worker in workers.iter().chain([&holder]) {
        worker.expect_line("MODE shared", Duration::from_secs(10));
    }
    // Healthy, and every process has heartbeated (so each knows there are four).
    std::thread::sleep(Duration::from_millis(2_000));
    let healthy = mock.max_in_flight();
    assert!(healthy <= LIMIT, "healthy: {healthy} in flight, limit {LIMIT}");

    // The replica misses the last writes: the primary stops replicating, goes on serving for
    // 200 ms, then dies.
    let mut primary = group.primary().connection().expect("primary");
    group.cut_replication();
    holder.tell(&format!("ACQUIRE {HELD}"));
    let holding = holder.expect_line("HOLDING", Duration::from_secs(5));
    let held_ids: Vec<String> = holding
        .split_whitespace()
        .find_map(|kv| kv.strip_prefix("ids="))
        .expect("ids=")
        .split(',')
        .map(str::to_owned)
        .collect();
    std::thread::sleep(Duration::from_millis(200));
    let offset = |con: &mut redis::Connection, name: &str| -> u64 {
        let info: String = redis::cmd("INFO").arg("replication").query(con).expect("INFO replication");
        info.lines().find_map(|l| l.strip_prefix(&format!("{name}:"))?.trim().parse().ok()).expect(name)
    };
    let written = offset(&mut primary, "master_repl_offset");
    group.primary().kill().expect("kill -9 the primary");
    let killed = Instant::now();
    let replicated = offset(&mut group.replica().connection().expect("replica"), "slave_repl_offset");
    let lost = written.saturating_sub(replicated);
    for worker in workers.iter().chain([&holder]) {
        worker.expect_line("MODE fallback", Duration::from_secs(5));
    }
    let in_fallback = killed.elapsed();
    let failed_over = group.wait_failover(Duration::from_secs(20)).expect("the sentinels promote the replica");
    // When each process shared again, on this process's clock.
    let shared_again: Vec<Instant> = workers
        .iter()
        .chain([&holder])
        .map(|worker| {
            let line = worker.expect_line("MODE shared", Duration::from_secs(10));
            let at = std::time::UNIX_EPOCH + Duration::from_millis(field(&line, "at_ms"));
            let ago = std::time::SystemTime::now().duration_since(at).unwrap_or_default();
            Instant::now() - ago
        })
        .collect();
    let first_shared = shared_again.iter().min().copied().expect("four workers");
    let all_shared = shared_again.iter().max().copied().expect("four workers");
    let back = all_shared - killed;
    // A process back in shared mode keeps to its fallback share for 1.5 s while the others
    // rejoin: the switch ends when that grace has passed for the last one.
    let switch_end = all_shared + Duration::from_millis(1_500);
    // The holder's permits, lost with the old primary, are registered on the new one.
    std::thread::sleep(Duration::from_millis(200));
    let mut con = group.replica().connection().expect("the new primary");
    for id in &held_ids {
        let lease: Option<f64> =
            redis::cmd("ZSCORE").arg("wavegate:{mock}:permits").arg(id).query(&mut con).expect("ZSCORE");
        assert!(lease.is_some(), "the held permit {id} is not registered on the new primary");
    }

    let mut ok = 0;
    for worker in &workers {
        let line = worker.expect_line("RESULT", Duration::from_secs(60));
        assert_eq!(field(&line, "err"), 0, "no call may fail because of the failover: {line}");
        ok += field(&line, "ok");
    }
    holder.tell("RELEASE");
    holder.expect_line("RELEASED", Duration::from_secs(5));
    std::thread::sleep(Duration::from_millis(300));
    let spans = mock.spans();
    let last = spans.iter().map(|(_, end)| *end).max().expect("calls were served");
    let during = max_in_flight(&spans, killed, switch_end);
    // The calls admitted before the kill take 20 ms: from then on the fallback's shares rule.
    let in_outage = max_in_flight(&spans, killed + Duration::from_millis(100), first_shared);
    let after = max_in_flight(&spans, switch_end, last);
    let served_after = spans.iter().filter(|(start, _)| *start >= switch_end).count();
    let left: usize = redis::cmd("ZCARD").arg("wavegate:{mock}:permits").query(&mut con).expect("ZCARD");
    println!(
        "    the replica missed the last {lost} bytes of the primary's writes; all {PROCESSES} processes in fallback {:.0} ms after kill -9 of the primary; the sentinels promoted the \
         replica after {:.0} ms; the first shared again {:.0} ms, all {:.0} ms after the kill; max in flight: healthy {healthy}, during \
         the switch {during} (from 100 ms after the kill until the first process shares again: {in_outage}; the \
         callers' fair shares {CALLER_SHARES}), after it {after} (limit {LIMIT} less {HELD} held; {served_after} \
         calls); {ok} \
         calls, none failed; permits left on the new primary: {left}",
        in_fallback.as_secs_f64() * 1e3,
        (in_fallback.max(Duration::ZERO) + failed_over).as_secs_f64() * 1e3,
        (first_shared - killed).as_secs_f64() * 1e3,
        back.as_secs_f64() * 1e3,
    );
    assert!(lost > 0, "the promoted replica should lack the last writes");
    assert!(in_outage <= CALLER_SHARES, "{in_outage} calls at once in the outage; the shares sum to {CALLER_SHARES}");
    assert!(during <= LIMIT - HELD, "{during} calls at once during the switch; {HELD} of {LIMIT} are held");
    assert!(
        after <= LIMIT - HELD,
        "{after} calls at once after every process re-registered; {HELD} of {LIMIT} are held"
    );
    assert!(served_after > 100, "the load should go on after the switch: {served_after} calls");
    assert_eq!(left, 0, "every permit is released on the new primary once the load ends");
}

// ------------------------------------------------------------------------------------------
// The worker's side.

fn worker_main() {
    let system = actix::System::new();
    system.block_on(async {
        let limit: u32 = env("LIMIT").parse().expect("LIMIT");
        let mock: SocketAddr = env("MOCK_ADDR").parse().expect("MOCK_ADDR");
        let upstream = UpstreamConfig::builder("mock")
            .limit(limit)
            .renewed_lease(Duration::from_secs(3))
            .call_timeout(Duration::from_secs(10))
            .max_wait(Duration::from_secs(60))
            .total_timeout(Duration::from_secs(120))
            .build()
            .expect("config");
        let sentinels: Vec<String> = env("SENTINELS").split(',').map(str::to_owned).collect();
        let scheduler = Scheduler::builder()
            .upstream(upstream)
            .redis_sentinel(env("MASTER"), sentinels)
            .build()
            .expect("scheduler");
        report_mode_changes(scheduler.clone());
        if env("WORK") == "hold" {
            hold(&scheduler).await;
            return;
        }
        let callers: usize = env("CALLERS").parse().expect("CALLERS");
        let until = Instant::now() + Duration::from_millis(env("DURATION_MS").parse().expect("DURATION_MS"));
        let upstream = scheduler.upstream("mock").expect("configured");
        let (ok, err, first_error) = call_until(&upstream, mock, callers, until).await;
        // Let the last releases reach the store before the orchestrator looks.
        tokio::time::sleep(Duration::from_millis(300)).await;
        println!("RESULT ok={ok} err={err} first_error={first_error:?}");
        tokio::time::sleep(Duration::from_secs(30)).await;
    });
}

/// Takes permits when told `ACQUIRE n` on stdin, prints `HOLDING n ids=..`, drops them at
/// `RELEASE`.
async fn hold(scheduler: &Scheduler) {
    let (tx, mut commands) = tokio::sync::mpsc::unbounded_channel();
    std::thread::spawn(move || {
        for line in std::io::stdin().lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    let mut permits = Vec::new();
    while let Some(command) = commands.recv().await {
        if let Some(count) = command.strip_prefix("ACQUIRE ") {
            for _ in 0..count.parse::<usize>().expect("ACQUIRE n") {
                permits
                    .push(scheduler.upstream("mock").expect("configured").request().acquire().await.expect("permit"));
            }
            let ids: Vec<String> = permits.iter().map(|p| p.id().to_string()).collect();
            println!("HOLDING {} ids={}", permits.len(), ids.join(","));
        } else if command == "RELEASE" {
            permits.clear();
            tokio::time::sleep(Duration::from_millis(100)).await;
            println!("RELEASED");
        }
    }
}

/// Prints `MODE <mode>` at every change of the scheduler's mode.
fn report_mode_changes(scheduler: Scheduler) {
    actix::spawn(async move {
        let mut last = None;
        loop {
            let Ok(mode) = scheduler.mode().await else { return };
            if last != Some(mode) {
                let at = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
                println!("MODE {mode} at_ms={}", at.as_millis());
                last = Some(mode);
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    });
}
