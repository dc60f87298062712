//! Many processes, many upstreams, one Redis: what the shared store costs at scale. 32 real
//! worker processes × 10 callers, each call to one of 100 upstreams (limit 2 each) drawn at
//! random, against one mock provider; it reports the calls per second, the script calls sent
//! per granted permit, the Redis server's CPU (from `INFO cpu`), the permit wait and the
//! changes of mode.
//!
//! * `--schedulers K`: each worker process runs `K` schedulers (each its own instance, as `K`
//!   processes would be), its callers spread over them: `--processes 20 --schedulers 10` is a
//!   fleet of 200 schedulers;
//! * `--classes`: every upstream has two priority classes (a reserve for one, a share of a
//!   requests budget for the other), each call names a class and one of four tenants, and the
//!   mock provider announces its limits in the IETF headers on every answer, which wavegate
//!   learns (`scale_worker.rs` has the configuration);
//! * `--cluster` (and the crate's `cluster` feature): the same run follows on a 3-master Redis
//!   Cluster, in the same invocation: the CPU is then the sum over the masters, and each
//!   master's share is given too;
//! * always, last: an **oracle** with the same callers in one process, each upstream's limit a
//!   semaphore (it knows every limit and coordinates for free): the permit wait a perfect
//!   coordinator would give the same load.
//!
//! ```text
//! cargo run --release -p wavegate-scenarios -- scale
//! cargo run --release -p wavegate-scenarios -- scale --processes 20 --schedulers 10 --callers 20 --classes
//! cargo run --release -p wavegate-scenarios --features cluster -- scale --cluster
//! ```

use std::net::SocketAddr;
use std::process::ExitCode;
use std::rc::Rc;
use std::time::{Duration, Instant};

use rand::Rng;
use wavegate_testkit::{
    HeaderStyle, MockProvider, MockUpstream, MockUpstreamConfig, ProviderLimits, RedisCluster, RedisServer, http_get,
};

use crate::process_fleet::{ProcessFleet, option};
use crate::redis_stats::CommandStats;
use crate::scale_worker::{
    ENV_CALLERS, ENV_CLASSES, ENV_CLUSTER, ENV_PROVIDER, ENV_REDIS, ENV_SCHEDULERS, ENV_SECS, ENV_UPSTREAMS, LIMIT,
};
use crate::stats::percentile;

/// The runner (`scale [--processes N] [--callers N] [--upstreams N] [--secs N] [--service-ms N]
/// [--cluster]`).
pub(crate) fn runner_main(args: &[String]) -> ExitCode {
    match run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("wavegate-scenarios scale: {error}");
            ExitCode::FAILURE
        }
    }
}

/// The Redis server's CPU seconds so far (user + system), from `INFO cpu`.
fn redis_cpu(con: &mut redis::Connection) -> Result<f64, String> {
    let info: String = redis::cmd("INFO").arg("cpu").query(con).map_err(|e| e.to_string())?;
    let field = |name: &str| {
        info.lines().find_map(|l| l.strip_prefix(name).and_then(|v| v.trim().parse::<f64>().ok())).unwrap_or(0.0)
    };
    Ok(field("used_cpu_user:") + field("used_cpu_sys:"))
}

/// Where the fleet's store is: one server, or the masters of a cluster.
enum Target {
    Single(RedisServer),
    Cluster(RedisCluster),
}

impl Target {
    fn label(&self) -> String {
        match self {
            Target::Single(_) => "one Redis".to_string(),
            Target::Cluster(cluster) => format!("{}-master cluster", cluster.urls().len()),
        }
    }

    /// The URL(s) a worker is given, and whether they are a cluster's seeds.
    fn env(&self) -> (String, bool) {
        match self {
            Target::Single(server) => (server.url(), false),
            Target::Cluster(cluster) => (cluster.urls().join(","), true),
        }
    }

    /// A connection to each server (each master).
    fn connections(&mut self) -> Result<Vec<redis::Connection>, String> {
        let servers: Vec<&RedisServer> = match self {
            Target::Single(server) => vec![server],
            Target::Cluster(cluster) => cluster.nodes().iter().collect(),
        };
        servers.into_iter().map(|s| s.connection().map_err(|e| e.to_string())).collect()
    }
}

/// The options of a run.
#[derive(Debug, Clone, Copy)]
struct Options {
    processes: usize,
    schedulers: usize,
    callers: usize,
    upstreams: usize,
    secs: f64,
    service_ms: f64,
    classes: bool,
}

fn run(args: &[String]) -> Result<(), String> {
    let options = Options {
        processes: option(args, "--processes", 32.0)? as usize,
        schedulers: (option(args, "--schedulers", 1.0)? as usize).max(1),
        callers: option(args, "--callers", 10.0)? as usize,
        upstreams: option(args, "--upstreams", 100.0)? as usize,
        secs: option(args, "--secs", 15.0)?,
        service_ms: option(args, "--service-ms", 50.0)?,
        classes: args.iter().any(|a| a == "--classes"),
    };
    let cluster = args.iter().any(|a| a == "--cluster");
    if cluster && !cfg!(feature = "cluster") {
        return Err("--cluster needs the crate's `cluster` feature: cargo run --release -p wavegate-scenarios \
                    --features cluster -- scale --cluster"
            .to_string());
    }
    let Options { processes, schedulers, callers, upstreams, secs, service_ms, classes } = options;
    println!(
        "# scale: {processes} processes x {schedulers} schedulers, {callers} callers per process, {upstreams} upstreams \
         of limit {LIMIT} (each call to one drawn at random), {service_ms} ms calls, {secs} s, {}; on one Redis{}, then \
         an oracle",
        if classes { "with classes, tenants, a class budget and learned limits" } else { "no classes" },
        if cluster { ", then on a 3-master Redis Cluster" } else { "" }
    );
    let mut rows = vec![pass(&options, Target::Single(RedisServer::start().map_err(|e| e.to_string())?))?];
    if cluster {
        rows.push(pass(&options, Target::Cluster(RedisCluster::start(3).map_err(|e| e.to_string())?))?);
    }
    rows.push(oracle(&options)?);
    println!();
    println!(
        "| store | processes x schedulers x callers | classes | upstreams | calls | calls/s | failed | changes of mode | script calls sent per permit | commands executed per permit | Redis CPU per permit (µs) | Redis CPU (per master) | permit wait p50 / p99 / max (ms) | max at the provider |"
    );
    println!("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for row in rows {
        println!("{row}");
    }
    Ok(())
}

/// The mock provider of a run: a plain one, or (with classes) one that announces its limits.
enum Provider {
    Plain(MockUpstream),
    Announcing(MockProvider),
}

impl Provider {
    fn start(options: &Options) -> Result<Self, String> {
        let service = Duration::from_secs_f64(options.service_ms / 1000.0);
        if options.classes {
            // Announced on every answer and learned; far above what the run sends, so it
            // refuses nothing (the limits are the upstreams' own).
            let limits = ProviderLimits {
                style: HeaderStyle::Ietf,
                requests: Some(6_000_000),
                tokens: None,
                window: Duration::from_secs(60),
                quota_exhausted: false,
            };
            MockProvider::start(limits, service).map(Provider::Announcing).map_err(|e| format!("mock provider: {e}"))
        } else {
            MockUpstream::start(MockUpstreamConfig { service_time: service, ..Default::default() })
                .map(Provider::Plain)
                .map_err(|e| format!("mock provider: {e}"))
        }
    }

    fn addr(&self) -> SocketAddr {
        match self {
            Provider::Plain(mock) => mock.addr(),
            Provider::Announcing(mock) => mock.addr(),
        }
    }

    fn max_in_flight(&self) -> usize {
        match self {
            Provider::Plain(mock) => mock.max_in_flight(),
            Provider::Announcing(mock) => mock.max_in_flight(),
        }
    }
}

/// One run of the fleet against `target`: its row of the table.
fn pass(options: &Options, mut target: Target) -> Result<String, String> {
    let Options { processes, schedulers, callers, upstreams, secs, classes, .. } = *options;
    let provider = Provider::start(options)?;
    println!("# {}: starting {processes} workers", target.label());
    let ((redis_url, cluster), provider_addr) = (target.env(), provider.addr().to_string());
    let mut fleet = ProcessFleet::spawn("scale-worker", processes, |_| {
        let mut env = vec![
            (ENV_REDIS, redis_url.clone()),
            (ENV_PROVIDER, provider_addr.clone()),
            (ENV_UPSTREAMS, upstreams.to_string()),
            (ENV_CALLERS, callers.to_string()),
            (ENV_SECS, secs.to_string()),
            (ENV_SCHEDULERS, schedulers.to_string()),
        ];
        if cluster {
            env.push((ENV_CLUSTER, "1".to_string()));
        }
        if classes {
            env.push((ENV_CLASSES, "1".to_string()));
        }
        env
    })?;
    let mut waits = Vec::new();
    let (mut failed, mut switches) = (0u64, 0u64);
    let mut take = |line: &str| match line {
        "e" => failed += 1,
        _ if line.starts_with("modes ") => switches += line[6..].parse::<u64>().unwrap_or(0),
        _ => waits.extend(line.strip_prefix("w ").and_then(|v| v.parse::<f64>().ok())),
    };
    fleet.wait_all("ready", Duration::from_secs(120), &mut take)?;
    let mut cons = target.connections()?;
    let mut cpu_before = Vec::new();
    for con in &mut cons {
        redis::cmd("CONFIG").arg("RESETSTAT").exec(con).map_err(|e| e.to_string())?;
        cpu_before.push(redis_cpu(con)?);
    }
    let started = Instant::now();
    fleet.send_all("go")?;
    fleet.wait_all("done", Duration::from_secs_f64(secs + 120.0), &mut take)?;
    let took = started.elapsed().as_secs_f64();
    let mut cpus = Vec::new();
    let mut stats = CommandStats::default();
    for (con, before) in cons.iter_mut().zip(cpu_before) {
        cpus.push(100.0 * (redis_cpu(con)? - before) / took);
        stats.add(&CommandStats::read(con).map_err(|e| e.to_string())?);
    }
    drop(fleet);
    let granted = waits.len().max(1) as f64;
    let evalsha = stats.calls.get("evalsha").copied().unwrap_or(0) as f64;
    // Where the commands go: each command's calls per permit, the most first.
    let mut each: Vec<(&String, &u64)> = stats.calls.iter().collect();
    each.sort_by(|a, b| b.1.cmp(a.1));
    let each: Vec<String> =
        each.iter().map(|(name, calls)| format!("{name} {:.2}", **calls as f64 / granted)).collect();
    println!("# {}: per permit: {}", target.label(), each.join(", "));
    if let Some((script, inside)) = stats.script_time() {
        println!(
            "# {}: per script call: {script:.1} µs in Redis, {inside:.1} µs of it in the commands it ran, {:.1} µs in Lua",
            target.label(),
            script - inside
        );
    }
    let calls = waits.len();
    let mut p = |q| percentile(&mut waits, q).unwrap_or(f64::NAN);
    let (p50, p99, max) = (p(50.0), p(99.0), p(100.0));
    let cpu: f64 = cpus.iter().sum();
    let per_master = if cpus.len() > 1 {
        format!(" ({})", cpus.iter().map(|c| format!("{c:.0}")).collect::<Vec<_>>().join(" + "))
    } else {
        String::new()
    };
    // CPU % of one core over `took` seconds, per permit, in µs.
    let cpu_per_permit_us = cpu / 100.0 * took / granted * 1e6;
    Ok(format!(
        "| {} | {processes} x {schedulers} x {callers} | {} | {upstreams} | {} | {:.0} | {failed} | {switches} | {:.2} | {:.1} | {cpu_per_permit_us:.0} | {cpu:.0} %{per_master} of one core | {p50:.1} / {p99:.1} / {max:.0} | {} |",
        target.label(),
        if classes { "yes" } else { "no" },
        calls,
        calls as f64 / took,
        evalsha / granted,
        stats.executed() as f64 / granted,
        provider.max_in_flight(),
    ))
}

/// The oracle's row: the same callers (`processes × callers`) in this process, each upstream's
/// limit a semaphore: a coordinator that knows every limit and costs nothing.
fn oracle(options: &Options) -> Result<String, String> {
    let Options { processes, schedulers, callers, upstreams, secs, classes, .. } = *options;
    let provider = Provider::start(options)?;
    let addr = provider.addr();
    println!("# oracle: {} callers in one process", processes * callers);
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| e.to_string())?;
    let local = tokio::task::LocalSet::new();
    let (waits, failed, took) = local.block_on(&runtime, async move {
        let limits: Rc<Vec<tokio::sync::Semaphore>> =
            Rc::new((0..upstreams).map(|_| tokio::sync::Semaphore::new(LIMIT as usize)).collect());
        let waits = Rc::new(std::cell::RefCell::new((Vec::new(), 0u64)));
        let started = Instant::now();
        let end = started + Duration::from_secs_f64(secs);
        let tasks: Vec<_> = (0..processes * callers)
            .map(|_| {
                let (limits, waits) = (limits.clone(), waits.clone());
                tokio::task::spawn_local(async move {
                    while Instant::now() < end {
                        let index = rand::rng().random_range(0..limits.len());
                        let asked = Instant::now();
                        let Ok(_permit) = limits[index].acquire().await else { return };
                        let waited = asked.elapsed().as_secs_f64() * 1000.0;
                        let ok = http_get(addr, "/", Duration::from_secs(10)).await.is_ok_and(|r| r.status == 200);
                        let mut waits = waits.borrow_mut();
                        if ok { waits.0.push(waited) } else { waits.1 += 1 }
                    }
                })
            })
            .collect();
        for task in tasks {
            let _ = task.await;
        }
        let took = started.elapsed().as_secs_f64();
        let (waits, failed) = std::mem::take(&mut *waits.borrow_mut());
        (waits, failed, took)
    });
    let mut waits = waits;
    let calls = waits.len();
    let mut p = |q| percentile(&mut waits, q).unwrap_or(f64::NAN);
    let (p50, p99, max) = (p(50.0), p(99.0), p(100.0));
    Ok(format!(
        "| oracle (one process, a semaphore per upstream) | {processes} x {schedulers} x {callers} | {} | {upstreams} | {calls} | {:.0} | {failed} | – | – | – | – | – | {p50:.1} / {p99:.1} / {max:.0} | {} |",
        if classes { "yes" } else { "no" },
        calls as f64 / took,
        provider.max_in_flight(),
    ))
}
