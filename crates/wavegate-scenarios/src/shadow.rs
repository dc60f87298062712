//! `shadow`: the same open-loop load sent twice to a provider with a hidden concurrency cap,
//! through a fleet of schedulers on one Redis — once enforcing, once in shadow mode — and what
//! shadow mode says enforcing would have done, side by side with what enforcing did.
//!
//! ```text
//! cargo run --release -p wavegate-scenarios -- shadow [--secs 30] [--rate 60] [--capacity 8]
//!     [--service-ms 100] [--limit 16] [--schedulers 4] [--seed 1]
//! ```
//!
//! Calls arrive at the same seeded Poisson instants in both runs (open loop: an arrival does
//! not wait for an earlier call, as requests to a web service do not), each through one of
//! the schedulers in turn (each its own instance in the store, as processes are). Enforcing,
//! each attempt's permit wait counts (a retry waits again); in shadow, a call goes at once and
//! each attempt's ghost's wait is what enforcing would have made it wait
//! ([`wavegate::ShadowStatus`] counts a ghost per attempt).

use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::{Duration, Instant, SystemTime};

use rand::{Rng, SeedableRng};
use wavegate::{Outcome, Scheduler, ShadowStatus, TransportError, Upstream};
use wavegate_testkit::{MockUpstream, MockUpstreamConfig, RedisServer, http_get};

use crate::process_fleet::option;
use crate::stats::percentile;
use crate::strategy::{Recovery, configure};

/// The run's shape.
#[derive(Debug, Clone, Copy)]
struct Options {
    secs: f64,
    rate: f64,
    capacity: usize,
    service: Duration,
    limit: u32,
    schedulers: usize,
    seed: u64,
}

/// What one run measured.
#[derive(Debug, Default)]
struct Row {
    calls: usize,
    failed: usize,
    provider_max: usize,
    provider_429s: u64,
    /// Calls that waited (enforcing) or would have (shadow) 1 ms or more.
    waited: u64,
    mean_wait: Duration,
    max_wait: Duration,
    /// Waits at the 50th and 99th percentile (enforcing only: shadow keeps no distribution).
    p50_p99: Option<(Duration, Duration)>,
    refused: u64,
    /// The limit each scheduler ended with (in shadow: where the wave would have put it).
    limits: Vec<u32>,
    /// The 429s the wave took as the limit's (each started a wave: a step back or a stop),
    /// as the last scheduler saw the wave id at the end.
    cuts: u64,
    /// In shadow: retries that went without a ghost (enforcing would not have made them).
    retries_without_ghost: u64,
}

pub(crate) fn runner_main(args: &[String]) -> ExitCode {
    match run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("shadow: {error}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: &[String]) -> Result<(), String> {
    let options = Options {
        secs: option(args, "--secs", 30.0)?,
        rate: option(args, "--rate", 60.0)?,
        capacity: option(args, "--capacity", 8.0)? as usize,
        service: Duration::from_secs_f64(option(args, "--service-ms", 100.0)? / 1000.0),
        limit: option(args, "--limit", 16.0)? as u32,
        schedulers: (option(args, "--schedulers", 4.0)? as usize).max(1),
        seed: option(args, "--seed", 1.0)? as u64,
    };
    println!(
        "# shadow: {} calls/s for {} s (Poisson, seed {}), {} ms calls, a provider serving {} at once, {} schedulers \
         on one Redis, limit {} learned down",
        options.rate,
        options.secs,
        options.seed,
        options.service.as_millis(),
        options.capacity,
        options.schedulers,
        options.limit
    );
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| e.to_string())?;
    let enforcing = runtime.block_on(pass(options, false))?;
    let shadow = runtime.block_on(pass(options, true))?;
    println!();
    println!(
        "| run | calls | failed | provider max in flight | provider 429s | waited ≥ 1 ms | mean wait | max wait | wait p50 / p99 | refused | limit at the end | 429s learned from | retries without a ghost |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|");
    for (label, row) in [("enforcing", &enforcing), ("shadow (would have)", &shadow)] {
        let quantiles =
            row.p50_p99.map_or("–".to_owned(), |(p50, p99)| format!("{} / {} ms", p50.as_millis(), p99.as_millis()));
        println!(
            "| {label} | {} | {} | {} | {} | {} | {} ms | {} ms | {quantiles} | {} | {:?} | {} | {} |",
            row.calls,
            row.failed,
            row.provider_max,
            row.provider_429s,
            row.waited,
            row.mean_wait.as_millis(),
            row.max_wait.as_millis(),
            row.refused,
            row.limits,
            row.cuts,
            row.retries_without_ghost
        );
    }
    let ratio = |shadow: f64, enforcing: f64| if enforcing > 0.0 { shadow / enforcing } else { f64::NAN };
    println!();
    println!(
        "shadow / enforcing: waited {:.3}, mean wait {:.3}, max wait {:.3}, refused {} vs {}",
        ratio(shadow.waited as f64, enforcing.waited as f64),
        ratio(shadow.mean_wait.as_secs_f64(), enforcing.mean_wait.as_secs_f64()),
        ratio(shadow.max_wait.as_secs_f64(), enforcing.max_wait.as_secs_f64()),
        shadow.refused,
        enforcing.refused
    );
    Ok(())
}

/// One run, enforcing or in shadow, on a Redis and a provider of its own.
async fn pass(options: Options, shadow: bool) -> Result<Row, String> {
    let redis = RedisServer::start().map_err(|e| format!("redis-server: {e}"))?;
    let provider = MockUpstream::start(MockUpstreamConfig {
        capacity: Some(options.capacity),
        service_time: options.service,
        retry_after: "1".to_owned(),
        ..Default::default()
    })
    .map_err(|e| format!("mock: {e}"))?;
    let config = configure(Recovery::Adaptive, options.limit, Duration::from_secs(3))
        .shadow(shadow)
        .build()
        .map_err(|e| e.to_string())?;
    let schedulers: Vec<Scheduler> = (0..options.schedulers)
        .map(|_| Scheduler::builder().upstream(config.clone()).redis(redis.url()).build().map_err(|e| e.to_string()))
        .collect::<Result<_, _>>()?;
    let upstreams: Vec<Upstream> = schedulers
        .iter()
        .map(|s| s.upstream(crate::worker::UPSTREAM).map_err(|e| e.to_string()))
        .collect::<Result<_, _>>()?;
    let mut rng = rand::rngs::StdRng::seed_from_u64(options.seed);
    let (mut at, mut arrivals) = (0.0, Vec::new());
    loop {
        at += -(1.0 - rng.random::<f64>()).ln() / options.rate;
        if at >= options.secs {
            break;
        }
        arrivals.push(Duration::from_secs_f64(at));
    }
    let start = tokio::time::Instant::now();
    let addr = provider.addr();
    let tasks: Vec<_> = arrivals
        .iter()
        .enumerate()
        .map(|(i, &offset)| {
            let upstream = upstreams[i % upstreams.len()].clone();
            tokio::spawn(async move {
                tokio::time::sleep_until(start + offset).await;
                let mut waited = Vec::new();
                let result = upstream
                    .request()
                    .call(|attempt| {
                        waited.push(attempt.waited);
                        call(addr)
                    })
                    .await;
                (waited, result.is_ok())
            })
        })
        .collect();
    let mut waits = Vec::new();
    let mut row = Row { calls: tasks.len(), ..Row::default() };
    for task in tasks {
        let (waited, ok) = task.await.map_err(|e| e.to_string())?;
        row.failed += usize::from(!ok);
        row.refused += u64::from(waited.is_empty());
        waits.extend(waited);
    }
    row.provider_max = provider.max_in_flight();
    row.provider_429s = provider.rate_limited();
    for upstream in &upstreams {
        let status = upstream.status().await.map_err(|e| e.to_string())?;
        row.limits.push(status.limit);
        row.cuts = status.wave.saturating_sub(1);
    }
    if shadow {
        let recorded = settled(&upstreams).await?;
        row.waited = recorded.iter().map(|s| s.would_have_waited).sum();
        let granted: u64 = recorded.iter().map(|s| s.would_have_granted).sum();
        let total: Duration = recorded.iter().map(|s| s.would_have_waited_total).sum();
        row.mean_wait = total / u32::try_from(granted.max(1)).unwrap_or(u32::MAX);
        row.max_wait = recorded.iter().map(|s| s.would_have_waited_max).max().unwrap_or_default();
        row.refused = recorded.iter().map(ShadowStatus::refused).sum();
        row.retries_without_ghost = recorded.iter().map(|s| s.retries_without_ghost).sum();
    } else {
        row.waited = waits.iter().filter(|w| **w >= Duration::from_millis(1)).count() as u64;
        let total: Duration = waits.iter().sum();
        row.mean_wait = total / u32::try_from(waits.len().max(1)).unwrap_or(u32::MAX);
        row.max_wait = waits.iter().max().copied().unwrap_or_default();
        let mut ms: Vec<f64> = waits.iter().map(|w| w.as_secs_f64() * 1000.0).collect();
        let p50 = percentile(&mut ms, 50.0).unwrap_or(0.0);
        let p99 = percentile(&mut ms, 99.0).unwrap_or(0.0);
        row.p50_p99 = Some((Duration::from_secs_f64(p50 / 1000.0), Duration::from_secs_f64(p99 / 1000.0)));
    }
    Ok(row)
}

/// Each scheduler's shadow counts once none of its ghosts waits (bounded).
async fn settled(upstreams: &[Upstream]) -> Result<Vec<ShadowStatus>, String> {
    let started = Instant::now();
    loop {
        let mut all = Vec::new();
        for upstream in upstreams {
            all.push(upstream.status().await.map_err(|e| e.to_string())?.shadow);
        }
        if all.iter().all(|s| s.waiting == 0) || started.elapsed() > Duration::from_secs(600) {
            return Ok(all);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// One `GET /` to the provider, as the scheduler's closure returns it.
async fn call(addr: SocketAddr) -> Result<(), Outcome> {
    match http_get(addr, "/", Duration::from_secs(10)).await {
        Ok(reply) if reply.status == 200 => Ok(()),
        Ok(reply) => Err(Outcome::from_status(reply.status, reply.retry_after.as_deref(), SystemTime::now())),
        Err(_) => Err(Outcome::from_transport(TransportError::Connect)),
    }
}
