//! The nemesis: real worker processes calling a counting mock provider through one real Redis,
//! while a seeded schedule of faults hits it — kill -9 and an empty restart of Redis, SIGSTOP
//! for 1–3 s, `CLIENT PAUSE ALL 2000`, `SCRIPT FLUSH`, kill -9 of a worker (respawned), a black
//! hole between one worker and Redis for 2 s. Then it checks, from the mock's own record of
//! each call and from each process's mode timeline:
//!
//! Each call takes 100 ms at the mock, so the fleet is bound by the limit rather than by a shared
//! CPU and the throughput check measures capacity.
//!
//! * with every process in shared mode (and no change of mode within 300 ms) at most `limit`
//!   calls at once; with every process in fallback at most the sum of their shares, and the
//!   shares sum to at most the limit; with some in fallback, at most the limit plus their
//!   shares; within 300 ms of a change of mode, docs/guarantees.md's bound: the limit plus the shares
//!   of every process in fallback in that window;
//! * no call lost: each process that ran to the end submitted exactly ok + typed errors;
//! * after a quiet period the permits set holds exactly what the processes hold (besides the
//!   permits of a killed worker, which live at most one lease), and `limit` permits can be
//!   acquired at once;
//! * the throughput of the last 5 s is at least 90 % of the first 5 s.
//!
//! `WAVEGATE_NEMESIS_SEED` replays a run (the seed is printed), `WAVEGATE_NEMESIS_SECS` sets its
//! length (default 45 s), `WAVEGATE_NEMESIS_LEASE=fixed` uses the seed design's fixed 660 s TTL
//! instead of the default renewed lease, `WAVEGATE_NEMESIS_TIGHTEN=1` makes every check one notch
//! stricter than the truth (the run must then report every invariant broken: a check that
//! cannot fail checks nothing). This binary is its own worker (run with
//! `WAVEGATE_NEMESIS_ROLE=worker`). `harness = false`: it prints `N passed, M failed` itself.
//!
//! The second scenario, `nemesis_drawn` (`nemesis/drawn.rs`), draws the configuration and a
//! hostile provider from each seed as well; both share the workers, timelines and faults of
//! `nemesis/fleet.rs`.

use std::collections::{BTreeMap, HashSet};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use wavegate::{Mode, Scheduler, UpstreamConfig};
use wavegate_testkit::{FaultProxy, MockUpstream, MockUpstreamConfig, RedisServer};

#[path = "nemesis/checks.rs"]
mod checks;
mod common;
#[path = "nemesis/draw.rs"]
mod draw;
#[path = "nemesis/drawn.rs"]
mod drawn;
#[path = "nemesis/fleet.rs"]
mod fleet;
#[path = "nemesis/hostile.rs"]
mod hostile;
#[path = "nemesis/worker.rs"]
mod worker;
use common::{call_mock, env, field};
use fleet::{FaultKind, Life, ROLE, Worker, report_mode_changes, serve_commands, store_fault, unix_ms};

const PROCESSES: usize = 4;
const CALLERS: usize = 25;
const LIMIT: usize = 10;
/// How long each call takes at the mock.
const SERVICE: Duration = Duration::from_millis(100);
/// Faults begin after the first throughput window and end this long before the last one.
const BASELINE: (u64, u64) = (1_000, 6_000);
const QUIET_BEFORE_END_MS: u64 = 11_000;
/// The default renewed lease (what a killed worker's permits can cost).
const DEFAULT_LEASE_MS: u64 = 3_000;
const FIXED_TTL: Duration = Duration::from_secs(660);

fn main() {
    match std::env::var(ROLE).as_deref() {
        Ok("drawn") => return worker::worker_main(),
        Ok(_) => return worker_main(),
        Err(_) => {}
    }
    common::run_scenarios(&[("nemesis", nemesis), ("nemesis_drawn", drawn::run)]);
}

fn nemesis() {
    let seed: u64 = std::env::var("WAVEGATE_NEMESIS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| rand::rng().random_range(0..1_000_000));
    let secs: u64 = std::env::var("WAVEGATE_NEMESIS_SECS").ok().and_then(|s| s.parse().ok()).unwrap_or(45);
    let fixed = std::env::var("WAVEGATE_NEMESIS_LEASE").is_ok_and(|l| l == "fixed");
    // Every check made one notch stricter than the truth, to see each of them fail.
    let tighten = std::env::var("WAVEGATE_NEMESIS_TIGHTEN").is_ok_and(|t| t == "1");
    let notch = usize::from(tighten);
    let mut broken: Vec<String> = Vec::new();
    let lease_ms = if fixed { FIXED_TTL.as_millis() as u64 } else { DEFAULT_LEASE_MS };
    // Odd seeds run with priority classes (a quarter of the callers interactive, weight 3;
    // the others batch), without drawing from the schedule's generator, so a seed replays the
    // same faults either way; WAVEGATE_NEMESIS_CLASSES=0/1 overrides.
    let classes = match std::env::var("WAVEGATE_NEMESIS_CLASSES").as_deref() {
        Ok("1") => true,
        Ok("0") => false,
        _ => seed % 2 == 1,
    };
    println!(
        "    nemesis: seed {seed} (replay: WAVEGATE_NEMESIS_SEED={seed}), {secs} s, lease: {}, classes: {}",
        if fixed { "fixed 660 s TTL" } else { "default (3 s, renewed every second)" },
        if classes { "interactive 3 / batch 1" } else { "none" }
    );
    let mut rng = SmallRng::seed_from_u64(seed);
    let duration_ms = secs.max(20) * 1_000;

    let mut redis = RedisServer::start().expect("redis-server");
    let mock =
        MockUpstream::start(MockUpstreamConfig { service_time: SERVICE, ..Default::default() }).expect("mock upstream");
    let proxies: Vec<FaultProxy> =
        (0..PROCESSES).map(|_| FaultProxy::start(redis.addr()).expect("fault proxy")).collect();
    let (base_instant, base_ms) = (Instant::now(), unix_ms());
    let start_ms = base_ms + 2_000; // every worker is up by then
    let end_ms = start_ms + duration_ms;
    let env_for = |proxy: &FaultProxy| {
        vec![
            ("REDIS_URL", proxy.url()),
            ("MOCK_ADDR", mock.addr().to_string()),
            ("LIMIT", LIMIT.to_string()),
            ("CALLERS", CALLERS.to_string()),
            ("START_MS", start_ms.to_string()),
            ("END_MS", end_ms.to_string()),
            ("FIXED_TTL", u8::from(fixed).to_string()),
            ("CLASSES", u8::from(classes).to_string()),
        ]
    };
    let mut workers: Vec<Worker> = proxies.iter().map(|p| Worker::spawn("worker", &env_for(p))).collect();
    let mut lives: Vec<Arc<Mutex<Life>>> = workers.iter().map(|w| w.life.clone()).collect();
    let mut killed_pids: Vec<(u32, u64)> = Vec::new();

    // The schedule: one kill of a worker early enough for its lease to end before the last
    // window (when there is room for it), then a fault every 3–6 s until the quiet period.
    let faults_from = start_ms + BASELINE.1;
    let faults_until = end_ms - QUIET_BEFORE_END_MS;
    let kill_by = end_ms.saturating_sub(5_000 + lease_ms.min(DEFAULT_LEASE_MS) + 2_000);
    let mut schedule: Vec<(u64, FaultKind)> = Vec::new();
    if kill_by > faults_from {
        schedule.push((rng.random_range(faults_from..kill_by), FaultKind::WorkerKill));
    }
    let mut at = faults_from + rng.random_range(0..2_000);
    let kinds = [
        FaultKind::RedisKillRestart,
        FaultKind::RedisStop,
        FaultKind::ClientPause,
        FaultKind::ScriptFlush,
        FaultKind::BlackHole,
    ];
    while at < faults_until {
        schedule.push((at, kinds[rng.random_range(0..kinds.len())]));
        at += rng.random_range(3_000..6_000);
    }
    schedule.sort_by_key(|(at, _)| *at);
    let mut log = Vec::new();
    for (at, kind) in schedule {
        let now = unix_ms();
        if at > now {
            std::thread::sleep(Duration::from_millis(at - now));
        }
        let t = (unix_ms() - start_ms) as f64 / 1e3;
        match kind {
            FaultKind::WorkerKill => {
                let i = rng.random_range(0..PROCESSES);
                let pid = workers[i].child.id();
                let killed = workers[i].kill();
                killed_pids.push((pid, killed));
                workers[i] = Worker::spawn("worker", &env_for(&proxies[i]));
                lives.push(workers[i].life.clone());
                log.push(format!("{t:.1}s kill -9 of worker {i} (pid {pid}), respawned"));
            }
            _ => log.push(format!("{t:.1}s {}", store_fault(kind, &mut rng, &mut redis, &proxies))),
        }
    }
    for line in &log {
        println!("      fault at {line}");
    }

    // The end of the load: every worker reports what its callers submitted and got.
    let (mut submitted, mut ok, mut errors) = (0, 0, 0);
    let mut codes = BTreeMap::<String, u64>::new();
    for worker in &workers {
        let left = Duration::from_millis(end_ms.saturating_sub(unix_ms())) + Duration::from_secs(40);
        let line = worker.expect_line("RESULT", left);
        let (s, o, e) = (field(&line, "submitted"), field(&line, "ok"), field(&line, "err"));
        if s + notch as u64 != o + e {
            broken.push(format!("calls lost by worker {}: {line}", worker.child.id()));
        }
        if field(&line, "held") + notch as u64 != 0 {
            broken.push(format!("permits held with no call running: {line}"));
        }
        submitted += s;
        ok += o;
        errors += e;
        for kv in line.split_whitespace().filter_map(|kv| kv.strip_prefix("code:")) {
            if let Some((code, n)) = kv.split_once('=') {
                *codes.entry(code.to_string()).or_default() += n.parse::<u64>().unwrap_or(0);
            }
        }
    }

    // A quiet period, then the permits set against what the processes hold.
    let quiet = Instant::now();
    while workers.iter().any(|w| w.mode() != Mode::Shared) {
        assert!(quiet.elapsed() < Duration::from_secs(10), "not every worker is back in shared mode");
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(1_500));
    let mut held = HashSet::new();
    for worker in &mut workers {
        worker.send("hold");
        let line = worker.expect_line("HOLDING", Duration::from_secs(10));
        match line.split_whitespace().nth(1) {
            Some(id) if id != "none" => {
                held.insert(id.to_string());
            }
            _ => broken.push(format!("worker {} got no permit within 5 s after the drain", worker.child.id())),
        }
    }
    std::thread::sleep(Duration::from_millis(300));
    let mut con = redis.connection().expect("connection");
    let members: Vec<(String, u64)> = redis::cmd("ZRANGE")
        .arg("wavegate:{mock}:permits")
        .arg(0)
        .arg(-1)
        .arg("WITHSCORES")
        .query(&mut con)
        .expect("ZRANGE");
    let of_killed = |id: &str| killed_pids.iter().find(|(pid, _)| id.starts_with(&format!("{pid}-")));
    let mut lingering = 0;
    let mut unexplained = Vec::new();
    for (id, expiry) in &members {
        match of_killed(id) {
            Some((_, killed)) => {
                lingering += 1;
                if *expiry + notch as u64 * lease_ms > killed + lease_ms + 2_000 {
                    broken.push(format!(
                        "a killed worker's permit {id} outlives one lease: expires {} ms after the kill",
                        expiry.saturating_sub(*killed)
                    ));
                }
            }
            None if !held.contains(id) => {
                unexplained.push(format!("{id} (expires in {} ms)", *expiry as i64 - unix_ms() as i64));
            }
            None => {}
        }
    }
    let registered: HashSet<&String> = members.iter().map(|(id, _)| id).collect();
    let unregistered = held.iter().filter(|id| !registered.contains(id)).count();
    for worker in &mut workers {
        worker.send("release");
        worker.expect_line("RELEASED", Duration::from_secs(5));
    }
    std::thread::sleep(Duration::from_millis(300));
    workers[0].send(&format!("capacity {LIMIT}"));
    let capacity = workers[0].expect_line("CAPACITY", Duration::from_secs(10));
    let got = field(&capacity, "got");

    // The referee's record, against the timelines.
    let to_ms = |i: Instant| base_ms + i.duration_since(base_instant).as_millis() as u64;
    let spans: Vec<(u64, u64)> = mock.spans().into_iter().map(|(a, b)| (to_ms(a), to_ms(b))).collect();
    let lives: Vec<std::sync::MutexGuard<'_, Life>> = lives.iter().map(|l| l.lock().expect("timeline")).collect();
    let outlive = SERVICE.as_millis() as u64 + 100;
    let peaks = fleet::concurrency(&spans, &lives, LIMIT, notch, start_ms, fleet::SWITCH_WINDOW_MS, outlive);
    let (max_shared, max_fallback, max_mixed, max_switching) =
        (peaks.shared, peaks.fallback, peaks.partial, peaks.switching);
    let (violations, shares_over, switches) = (peaks.violations, peaks.shares_over, peaks.switches);
    let mut starts: Vec<u64> = spans.iter().map(|s| s.0).collect();
    starts.sort_unstable();
    let rate = |from: u64, to: u64| {
        starts.iter().filter(|t| (from..to).contains(*t)).count() as f64 * 1e3 / (to - from) as f64
    };
    let first = rate(start_ms + BASELINE.0, start_ms + BASELINE.1);
    let last = rate(end_ms - 5_000, end_ms);
    println!(
        "      calls: submitted {submitted}, ok {ok}, typed errors {errors} {codes:?}, lost {}",
        submitted - ok - errors
    );
    println!(
        "      most at once at the mock (limit {LIMIT}): shared {max_shared}, all in fallback {max_fallback}, \
         partial {max_mixed}, within {} ms of one of the {switches} changes of mode {max_switching}",
        fleet::SWITCH_WINDOW_MS
    );
    println!("      throughput: first 5 s {first:.0} calls/s, last 5 s {last:.0} calls/s");
    println!(
        "      after the drain: {} permits in Redis, {} held by the processes ({} of them unregistered), {lingering} \
         of killed workers, {} unexplained; {got} of {LIMIT} permits acquired at once",
        members.len(),
        held.len(),
        unregistered,
        unexplained.len()
    );
    if !violations.is_empty() {
        broken.push(format!(
            "{} moments over the bound, e.g. {:?}",
            violations.len(),
            &violations[..violations.len().min(5)]
        ));
    }
    if !shares_over.is_empty() {
        broken.push(format!("fallback shares over the limit: {:?}", &shares_over[..shares_over.len().min(5)]));
    }
    if !unexplained.is_empty() || notch > 0 {
        broken.push(format!("permits in Redis that no process holds: {unexplained:?}"));
    }
    if unregistered + notch != 0 {
        broken.push(format!("{unregistered} permits held but not registered in Redis"));
    }
    if got != (LIMIT + notch) as u64 {
        broken.push(format!("a full-limit capacity check: {capacity}"));
    }
    if last < (0.9 + notch as f64) * first {
        broken.push(format!("throughput fell from {first:.0}/s to {last:.0}/s"));
    }
    for problem in &broken {
        println!("      BROKEN: {problem}");
    }
    assert!(broken.is_empty(), "{} invariants broken (seed {seed}): {broken:?}", broken.len());
}

// ------------------------------------------------------------------------------------------
// The worker's side.

fn worker_main() {
    let system = actix::System::new();
    system.block_on(async {
        let limit: u32 = env("LIMIT").parse().expect("LIMIT");
        let mock: SocketAddr = env("MOCK_ADDR").parse().expect("MOCK_ADDR");
        let mut upstream = UpstreamConfig::builder("mock").limit(limit);
        if env("FIXED_TTL") == "1" {
            upstream = upstream.permit_ttl(FIXED_TTL);
        }
        let classes = env("CLASSES") == "1";
        if classes {
            upstream = upstream.class("interactive", 3).class("batch", 1).default_class("batch");
        }
        let upstream = upstream.build().expect("config");
        let scheduler = Scheduler::builder().upstream(upstream).redis(env("REDIS_URL")).build().expect("scheduler");
        report_mode_changes(scheduler.clone());
        let start_ms: u64 = env("START_MS").parse().expect("START_MS");
        let end_ms: u64 = env("END_MS").parse().expect("END_MS");
        tokio::time::sleep(Duration::from_millis(start_ms.saturating_sub(unix_ms()))).await;
        let callers: usize = env("CALLERS").parse().expect("CALLERS");
        let mut tasks = Vec::new();
        let llm = scheduler.upstream("mock").expect("configured");
        for caller in 0..callers {
            let llm = llm.clone();
            let class = if classes && caller % 4 == 0 { "interactive" } else { "batch" };
            tasks.push(actix::spawn(async move {
                let (mut submitted, mut ok, mut codes) = (0u64, 0u64, BTreeMap::<&'static str, u64>::new());
                while unix_ms() < end_ms {
                    submitted += 1;
                    let request = if classes { llm.request().priority(class) } else { llm.request() };
                    match request.call(move |_| call_mock(mock)).await {
                        Ok(()) => ok += 1,
                        Err(error) => *codes.entry(error.code()).or_default() += 1,
                    }
                }
                (submitted, ok, codes)
            }));
        }
        let (mut submitted, mut ok, mut codes) = (0, 0, BTreeMap::<&'static str, u64>::new());
        for task in tasks {
            // A caller task that panicked would lose its calls: they stay submitted.
            if let Ok((s, o, c)) = task.await {
                submitted += s;
                ok += o;
                for (code, n) in c {
                    *codes.entry(code).or_default() += n;
                }
            }
        }
        let err: u64 = codes.values().sum();
        let codes: Vec<String> = codes.iter().map(|(c, n)| format!("code:{c}={n}")).collect();
        // Every call has returned: the coordinator must hold nothing for this process.
        let held = scheduler
            .upstream("mock")
            .expect("configured")
            .status()
            .await
            .map(|s| s.in_flight_local)
            .unwrap_or(usize::MAX);
        println!("RESULT submitted={submitted} ok={ok} err={err} held={held} {}", codes.join(" "));
        serve_commands(scheduler).await;
    });
}
