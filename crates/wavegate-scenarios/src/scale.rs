//! Many processes, many upstreams, one Redis: what the shared store costs at scale. 32 real
//! worker processes × 10 callers, each call to one of 100 upstreams (limit 2 each) drawn at
//! random, against one mock provider; it reports the calls per second, the script calls sent
//! per granted permit, the Redis server's CPU (from `INFO cpu`) and the permit wait.
//!
//! With `--cluster` (and the crate's `cluster` feature) the same run follows on a 3-master
//! Redis Cluster, in the same invocation: the CPU is then the sum over the masters, and each
//! master's share is given too.
//!
//! ```text
//! cargo run --release -p wavegate-scenarios -- scale
//! cargo run --release -p wavegate-scenarios -- scale --processes 8 --upstreams 20 --secs 10
//! cargo run --release -p wavegate-scenarios --features cluster -- scale --cluster
//! ```

use std::io::{BufRead, Write};
use std::net::SocketAddr;
use std::process::ExitCode;
use std::rc::Rc;
use std::time::{Duration, Instant};

use rand::Rng;
use wavegate::{Mode, Scheduler, UpstreamConfig};
use wavegate_testkit::{MockUpstream, MockUpstreamConfig, RedisCluster, RedisServer, http_get};

use crate::process_fleet::{ProcessFleet, option};
use crate::redis_stats::CommandStats;
use crate::stats::percentile;

/// The limit of each upstream.
const LIMIT: u32 = 2;

/// The server's URL, or a cluster's seed URLs separated by commas (with [`ENV_CLUSTER`]).
const ENV_REDIS: &str = "WAVEGATE_SCALE_REDIS";
/// Set: [`ENV_REDIS`] lists the seeds of a Redis Cluster.
const ENV_CLUSTER: &str = "WAVEGATE_SCALE_CLUSTER";
const ENV_PROVIDER: &str = "WAVEGATE_SCALE_PROVIDER";
const ENV_UPSTREAMS: &str = "WAVEGATE_SCALE_UPSTREAMS";
const ENV_CALLERS: &str = "WAVEGATE_SCALE_CALLERS";
const ENV_SECS: &str = "WAVEGATE_SCALE_SECS";

fn name(index: usize) -> String {
    format!("u{index:03}")
}

fn env(key: &str) -> Result<String, String> {
    std::env::var(key).map_err(|_| format!("{key} is not set"))
}

fn number<T: std::str::FromStr>(key: &str) -> Result<T, String> {
    env(key)?.parse().map_err(|_| format!("{key} is not a number"))
}

/// The worker role: `ready` once in shared mode, then on `go` calls for `secs` seconds, then
/// prints each call's permit wait (`w <ms>`, or `e` for a failed call) and `done`.
pub(crate) fn worker_main() -> ExitCode {
    match worker() {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("scale worker: {error}");
            ExitCode::FAILURE
        }
    }
}

fn worker() -> Result<(), String> {
    let redis = env(ENV_REDIS)?;
    let provider: SocketAddr = env(ENV_PROVIDER)?.parse().map_err(|e| format!("provider address: {e}"))?;
    let upstreams: usize = number(ENV_UPSTREAMS)?;
    let callers: usize = number(ENV_CALLERS)?;
    let secs: f64 = number(ENV_SECS)?;
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| e.to_string())?;
    let local = tokio::task::LocalSet::new();
    local.block_on(&runtime, async move {
        let mut builder = match std::env::var_os(ENV_CLUSTER) {
            Some(_) => Scheduler::builder().redis_cluster(redis.split(',')),
            None => Scheduler::builder().redis(redis),
        };
        for index in 0..upstreams {
            let config = UpstreamConfig::builder(name(index)).limit(LIMIT).max_wait(Duration::from_secs(60));
            builder = builder.upstream(config.build().map_err(|e| e.to_string())?);
        }
        let scheduler = builder.build().map_err(|e| e.to_string())?;
        let started = Instant::now();
        while scheduler.mode().await.map_err(|e| e.to_string())? != Mode::Shared {
            if started.elapsed() > Duration::from_secs(20) {
                return Err("not in shared mode after 20 s".to_string());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let handles = (0..upstreams)
            .map(|index| scheduler.upstream(&name(index)).map_err(|e| e.to_string()))
            .collect::<Result<Vec<_>, _>>()?;
        println!("ready");
        let mut line = String::new();
        std::io::stdin().lock().read_line(&mut line).map_err(|e| e.to_string())?;
        let end = Instant::now() + Duration::from_secs_f64(secs);
        // Every change of mode this process goes through (a store too slow for its command
        // timeout sends it to fallback).
        let switches = Rc::new(std::cell::Cell::new(0u32));
        {
            let (scheduler, switches) = (scheduler.clone(), switches.clone());
            tokio::task::spawn_local(async move {
                let mut last = Mode::Shared;
                loop {
                    if let Ok(mode) = scheduler.mode().await
                        && mode != last
                    {
                        switches.set(switches.get() + 1);
                        last = mode;
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            });
        }
        let waits = Rc::new(std::cell::RefCell::new(Vec::new()));
        let handles = Rc::new(handles);
        let tasks: Vec<_> = (0..callers)
            .map(|_| {
                let (waits, handles) = (waits.clone(), handles.clone());
                tokio::task::spawn_local(async move {
                    while Instant::now() < end {
                        let upstream = &handles[rand::rng().random_range(0..handles.len())];
                        let mut waited = Duration::ZERO;
                        let reply = upstream
                            .request()
                            .call(|attempt| {
                                waited += attempt.waited;
                                http_get(provider, "/", Duration::from_secs(10))
                            })
                            .await;
                        let ok = reply.is_ok_and(|r| r.status == 200);
                        waits.borrow_mut().push(ok.then_some(waited.as_secs_f64() * 1000.0));
                    }
                })
            })
            .collect();
        for task in tasks {
            task.await.map_err(|e| e.to_string())?;
        }
        let mut stdout = std::io::stdout().lock();
        for wait in waits.borrow().iter() {
            match wait {
                Some(ms) => writeln!(stdout, "w {ms:.3}"),
                None => writeln!(stdout, "e"),
            }
            .map_err(|e| e.to_string())?;
        }
        writeln!(stdout, "modes {}", switches.get()).map_err(|e| e.to_string())?;
        writeln!(stdout, "done").map_err(|e| e.to_string())
    })
}

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
struct Options {
    processes: usize,
    callers: usize,
    upstreams: usize,
    secs: f64,
    service_ms: f64,
}

fn run(args: &[String]) -> Result<(), String> {
    let options = Options {
        processes: option(args, "--processes", 32.0)? as usize,
        callers: option(args, "--callers", 10.0)? as usize,
        upstreams: option(args, "--upstreams", 100.0)? as usize,
        secs: option(args, "--secs", 15.0)?,
        service_ms: option(args, "--service-ms", 50.0)?,
    };
    let cluster = args.iter().any(|a| a == "--cluster");
    if cluster && !cfg!(feature = "cluster") {
        return Err("--cluster needs the crate's `cluster` feature: cargo run --release -p wavegate-scenarios \
                    --features cluster -- scale --cluster"
            .to_string());
    }
    let Options { processes, callers, upstreams, secs, service_ms } = options;
    println!(
        "# scale: {processes} processes x {callers} callers, {upstreams} upstreams of limit {LIMIT} (each call to one \
         drawn at random), {service_ms} ms calls, {secs} s, on one Redis{}",
        if cluster { ", then on a 3-master Redis Cluster" } else { "" }
    );
    let mut rows = vec![pass(&options, Target::Single(RedisServer::start().map_err(|e| e.to_string())?))?];
    if cluster {
        rows.push(pass(&options, Target::Cluster(RedisCluster::start(3).map_err(|e| e.to_string())?))?);
    }
    println!();
    println!(
        "| store | processes x callers | upstreams | calls | calls/s | failed | changes of mode | script calls sent per permit | commands executed per permit | Redis CPU (per master) | permit wait p50 / p99 / max (ms) | max at the provider |"
    );
    println!("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for row in rows {
        println!("{row}");
    }
    Ok(())
}

/// One run of the fleet against `target`: its row of the table.
fn pass(options: &Options, mut target: Target) -> Result<String, String> {
    let Options { processes, callers, upstreams, secs, service_ms } = *options;
    let service = Duration::from_secs_f64(service_ms / 1000.0);
    let provider = MockUpstream::start(MockUpstreamConfig { service_time: service, ..Default::default() })
        .map_err(|e| format!("mock provider: {e}"))?;
    println!("# {}: starting {processes} workers", target.label());
    let ((redis_url, cluster), provider_addr) = (target.env(), provider.addr().to_string());
    let mut fleet = ProcessFleet::spawn("scale-worker", processes, |_| {
        let mut env = vec![
            (ENV_REDIS, redis_url.clone()),
            (ENV_PROVIDER, provider_addr.clone()),
            (ENV_UPSTREAMS, upstreams.to_string()),
            (ENV_CALLERS, callers.to_string()),
            (ENV_SECS, secs.to_string()),
        ];
        if cluster {
            env.push((ENV_CLUSTER, "1".to_string()));
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
    fleet.wait_all("ready", Duration::from_secs(60), &mut take)?;
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
    let calls = waits.len();
    let mut p = |q| percentile(&mut waits, q).unwrap_or(f64::NAN);
    let (p50, p99, max) = (p(50.0), p(99.0), p(100.0));
    let cpu: f64 = cpus.iter().sum();
    let per_master = if cpus.len() > 1 {
        format!(" ({})", cpus.iter().map(|c| format!("{c:.0}")).collect::<Vec<_>>().join(" + "))
    } else {
        String::new()
    };
    Ok(format!(
        "| {} | {processes} x {callers} | {upstreams} | {} | {:.0} | {failed} | {switches} | {:.2} | {:.1} | {cpu:.0} %{per_master} of one core | {p50:.1} / {p99:.1} / {max:.0} | {} |",
        target.label(),
        calls,
        calls as f64 / took,
        evalsha / granted,
        stats.executed() as f64 / granted,
        provider.max_in_flight(),
    ))
}
