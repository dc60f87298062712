//! The worker process of the `scale` run: `K` schedulers (each its own instance, as `K`
//! processes would be) over the same upstreams, its callers spread over them. With classes,
//! every upstream has two priority classes (a reserve for one, a budget share for the other),
//! each call names a class and a tenant, and the limits the provider announces in its headers
//! are learned (the mock speaks the IETF fields on every answer).

use std::io::{BufRead, Write};
use std::net::SocketAddr;
use std::process::ExitCode;
use std::rc::Rc;
use std::time::{Duration, Instant, SystemTime};

use rand::Rng;
use wavegate::{Mode, Outcome, ProviderSignals, Scheduler, TransportError, UpstreamConfig};
use wavegate_testkit::{HttpReply, http_get};

/// The limit of each upstream.
pub(crate) const LIMIT: u32 = 2;
/// The classes of the run with classes: (name, weight), the first with a reserve, the second
/// with a share of the budget.
pub(crate) const CLASSES: [(&str, u32); 2] = [("interactive", 3), ("batch", 1)];
/// The tenants the calls name (with classes).
pub(crate) const TENANTS: usize = 4;

/// The server's URL, or a cluster's seed URLs separated by commas (with [`ENV_CLUSTER`]).
pub(crate) const ENV_REDIS: &str = "WAVEGATE_SCALE_REDIS";
/// Set: [`ENV_REDIS`] lists the seeds of a Redis Cluster.
pub(crate) const ENV_CLUSTER: &str = "WAVEGATE_SCALE_CLUSTER";
pub(crate) const ENV_PROVIDER: &str = "WAVEGATE_SCALE_PROVIDER";
pub(crate) const ENV_UPSTREAMS: &str = "WAVEGATE_SCALE_UPSTREAMS";
pub(crate) const ENV_CALLERS: &str = "WAVEGATE_SCALE_CALLERS";
pub(crate) const ENV_SECS: &str = "WAVEGATE_SCALE_SECS";
/// Schedulers per worker process.
pub(crate) const ENV_SCHEDULERS: &str = "WAVEGATE_SCALE_SCHEDULERS";
/// Set: classes, tenants, a class budget and learned limits.
pub(crate) const ENV_CLASSES: &str = "WAVEGATE_SCALE_CLASSES";

/// The name of upstream `index`.
pub(crate) fn name(index: usize) -> String {
    format!("u{index:03}")
}

fn env(key: &str) -> Result<String, String> {
    std::env::var(key).map_err(|_| format!("{key} is not set"))
}

fn number<T: std::str::FromStr>(key: &str) -> Result<T, String> {
    env(key)?.parse().map_err(|_| format!("{key} is not a number"))
}

/// Upstream `index`'s configuration in the run (with or without classes).
fn upstream(index: usize, classes: bool) -> Result<UpstreamConfig, String> {
    let mut config = UpstreamConfig::builder(name(index)).limit(LIMIT).max_wait(Duration::from_secs(60));
    if classes {
        // A budget far above what the run uses (so it paces nothing) that the batch class may
        // use half of: the budgets' and the class budget's paths run on every grant.
        config = config
            .class(CLASSES[0].0, CLASSES[0].1)
            .class(CLASSES[1].0, CLASSES[1].1)
            .reserve(CLASSES[0].0, 50)
            .requests_per_minute(600_000, 10_000)
            .class_budget(CLASSES[1].0, 50);
    }
    config.build().map_err(|e| e.to_string())
}

/// What the provider's answer means: its status and the limits its headers announce.
fn classify(result: &Result<HttpReply, std::io::Error>) -> Outcome {
    match result {
        Ok(reply) => {
            let headers = reply.headers.iter().map(|(name, value)| (name.as_str(), value.as_bytes()));
            Outcome::from_signals(reply.status, None, ProviderSignals::from_headers(headers, SystemTime::now()))
        }
        Err(_) => Outcome::from_transport(TransportError::Connect),
    }
}

/// The worker role: `ready` once every scheduler is in shared mode, then on `go` calls for
/// `secs` seconds, then prints each call's permit wait (`w <ms>`, or `e` for a failed call),
/// the changes of mode and `done`.
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
    let schedulers: usize = number::<usize>(ENV_SCHEDULERS)?.max(1);
    let classes = std::env::var_os(ENV_CLASSES).is_some();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| e.to_string())?;
    let local = tokio::task::LocalSet::new();
    local.block_on(&runtime, async move {
        let mut fleet = Vec::new();
        for _ in 0..schedulers {
            let mut builder = match std::env::var_os(ENV_CLUSTER) {
                Some(_) => Scheduler::builder().redis_cluster(redis.split(',')),
                None => Scheduler::builder().redis(redis.clone()),
            };
            for index in 0..upstreams {
                builder = builder.upstream(upstream(index, classes)?);
            }
            fleet.push(builder.build().map_err(|e| e.to_string())?);
        }
        let started = Instant::now();
        for scheduler in &fleet {
            while scheduler.mode().await.map_err(|e| e.to_string())? != Mode::Shared {
                if started.elapsed() > Duration::from_secs(30) {
                    return Err("not in shared mode after 30 s".to_string());
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        let handles = fleet
            .iter()
            .map(|scheduler| {
                (0..upstreams)
                    .map(|index| scheduler.upstream(&name(index)).map_err(|e| e.to_string()))
                    .collect::<Result<Vec<_>, _>>()
            })
            .collect::<Result<Vec<_>, _>>()?;
        println!("ready");
        let mut line = String::new();
        std::io::stdin().lock().read_line(&mut line).map_err(|e| e.to_string())?;
        let end = Instant::now() + Duration::from_secs_f64(secs);
        // Every change of mode these schedulers go through (a store too slow for its command
        // timeout sends an upstream to fallback).
        let switches = Rc::new(std::cell::Cell::new(0u32));
        for scheduler in &fleet {
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
            .map(|caller| {
                let (waits, handles) = (waits.clone(), handles.clone());
                tokio::task::spawn_local(async move {
                    let mine = &handles[caller % handles.len()];
                    while Instant::now() < end {
                        let (index, class, tenant) = {
                            let mut rng = rand::rng();
                            let class = CLASSES[usize::from(rng.random_bool(0.7))].0;
                            (rng.random_range(0..mine.len()), class, format!("t{}", rng.random_range(0..TENANTS)))
                        };
                        let mut request = mine[index].request().classify(classify);
                        if classes {
                            request = request.priority(class).tenant(tenant);
                        }
                        let mut waited = Duration::ZERO;
                        let reply = request
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
