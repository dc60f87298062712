//! What a permit costs, against what it would cost without wavegate, measured in one run.
//!
//! * `local`: acquire + release through the `Scheduler` (no Redis: the coordinator and
//!   supervisor actors, the local wave machine) vs a bare `tokio::sync::Semaphore`.
//! * `shared`: acquire + release through the `Scheduler` in shared mode vs the raw cost of
//!   the same two script calls (`SharedGate::acquire` + `SharedGate::finish`) on a `Store`,
//!   through the same client, against the same `redis-server` (started here on a free port,
//!   never 6379).
//!
//! Each scheduler is measured twice: with the default `max_wait` (25 s) and with a
//! `max_wait` of 20 ms. The coordinator arms one timer per acquire for its deadline, and actix
//! polls every pending timer of an actor's context at each of its messages, so the cost of an
//! acquire grows with the acquires of the last `max_wait`: the pair shows by how much.
//!
//! Every benchmark runs inside an actix `System` (`System::block_on` around a timed loop, via
//! `iter_custom`), since the scheduler's actors live there. After criterion's report the
//! ratios are printed: the median over criterion's samples of the mean time per iteration.
//!
//! ```sh
//! cargo bench --bench wavegate
//! ```

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use criterion::Criterion;
use wavegate::{Scheduler, UpstreamConfig};
use wavegate_core::{Admission, WaveSignal};
use wavegate_redis::{SharedGate, Store, StoreConfig};
use wavegate_testkit::RedisServer;

const UPSTREAM: &str = "bench";
/// The same, with a 20 ms `max_wait`.
const SHORT_WAIT: &str = "bench-short-wait";
/// An upstream with two priority classes (interactive 3, batch 1); requests in the default.
const CLASSES: &str = "bench-classes";

/// Per benchmark: the mean time per iteration of each timed call (ns).
static SAMPLES: Mutex<BTreeMap<&'static str, Vec<f64>>> = Mutex::new(BTreeMap::new());

fn record(id: &'static str, iters: u64, elapsed: Duration) -> Duration {
    if iters > 0 {
        let mut samples = SAMPLES.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        samples.entry(id).or_default().push(elapsed.as_nanos() as f64 / iters as f64);
    }
    elapsed
}

fn median(id: &str) -> Option<f64> {
    let samples = SAMPLES.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let mut values = samples.get(id)?.clone();
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied()
}

/// The upstream `name` with a limit of 10; `max_wait` 20 ms for [`SHORT_WAIT`], else the
/// default.
fn upstream(name: &str) -> UpstreamConfig {
    let builder = UpstreamConfig::builder(name).limit(10);
    let builder = if name == SHORT_WAIT { builder.max_wait(Duration::from_millis(20)) } else { builder };
    let builder = if name == CLASSES { builder.class("interactive", 3).class("batch", 1) } else { builder };
    builder.build().expect("a valid configuration")
}

/// Acquires that gave up after `max_wait` (with no contention at all) and were asked again.
static GAVE_UP: AtomicU64 = AtomicU64::new(0);

/// Times `iters` acquire + release pairs through the scheduler. An acquire that gives up
/// (possible with the 20 ms `max_wait`) is counted and asked again, its time included.
async fn scheduler_pairs(scheduler: &Scheduler, upstream: &str, iters: u64) -> Duration {
    let upstream = scheduler.upstream(upstream).expect("configured");
    let start = Instant::now();
    for _ in 0..iters {
        let permit = loop {
            match upstream.request().acquire().await {
                Ok(permit) => break permit,
                Err(error) if error.kind() == wavegate::ErrorKind::WaitedTooLong => {
                    GAVE_UP.fetch_add(1, Ordering::Relaxed);
                }
                Err(error) => panic!("acquire: {error}"),
            }
        };
        permit.succeeded();
    }
    start.elapsed()
}

fn local(c: &mut Criterion) {
    let system = actix::System::new();
    // Two schedulers, so that each coordinator holds only its own deadline timers.
    let (scheduler, short_wait) = system.block_on(async {
        let build = |name| Scheduler::builder().upstream(upstream(name)).build().expect("a local scheduler");
        (build(UPSTREAM), build(SHORT_WAIT))
    });
    let semaphore = tokio::sync::Semaphore::new(10);
    let mut group = c.benchmark_group("local");
    group.measurement_time(Duration::from_secs(4));
    group.bench_function("scheduler acquire+release", |b| {
        b.iter_custom(|iters| {
            record("local/scheduler", iters, system.block_on(scheduler_pairs(&scheduler, UPSTREAM, iters)))
        });
    });
    group.bench_function("scheduler acquire+release, max_wait 20 ms", |b| {
        b.iter_custom(|iters| {
            record("local/scheduler-short", iters, system.block_on(scheduler_pairs(&short_wait, SHORT_WAIT, iters)))
        });
    });
    group.bench_function("tokio Semaphore acquire+release", |b| {
        b.iter_custom(|iters| {
            let elapsed = system.block_on(async {
                let start = Instant::now();
                for _ in 0..iters {
                    let permit = semaphore.acquire().await.expect("never closed");
                    drop(std::hint::black_box(permit));
                }
                start.elapsed()
            });
            record("local/semaphore", iters, elapsed)
        });
    });
    group.finish();
}

fn shared(c: &mut Criterion) {
    let redis = RedisServer::start().expect("redis-server (install it or set WAVEGATE_REDIS_SERVER)");
    let system = actix::System::new();
    let config = upstream(UPSTREAM);
    // Two schedulers, so that each coordinator holds only its own deadline timers.
    let (scheduler, short_wait, classes) = system.block_on(async {
        let mut built = Vec::new();
        for name in [UPSTREAM, SHORT_WAIT, CLASSES] {
            let scheduler =
                Scheduler::builder().upstream(upstream(name)).redis(redis.url()).build().expect("a shared scheduler");
            // Wait until it has reached the store (scripts loaded, shared mode).
            let handle = scheduler.upstream(name).expect("configured");
            for _ in 0..100 {
                if handle.status().await.is_ok_and(|s| s.in_flight_fleet.is_some()) {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            built.push(scheduler);
        }
        (built.remove(0), built.remove(0), built.remove(0))
    });
    let gate = system.block_on(async {
        let store = Store::connect(StoreConfig::new(redis.url())).await.expect("the store");
        SharedGate::new(store, config.name(), config.wave())
    });
    let lease = config.permit_ttl();
    let mut next_id = 0u64;
    let mut group = c.benchmark_group("shared");
    group.measurement_time(Duration::from_secs(4));
    group.bench_function("scheduler acquire+release", |b| {
        b.iter_custom(|iters| {
            record("shared/scheduler", iters, system.block_on(scheduler_pairs(&scheduler, UPSTREAM, iters)))
        });
    });
    group.bench_function("scheduler acquire+release, max_wait 20 ms", |b| {
        b.iter_custom(|iters| {
            record("shared/scheduler-short", iters, system.block_on(scheduler_pairs(&short_wait, SHORT_WAIT, iters)))
        });
    });
    group.bench_function("scheduler acquire+release, two priority classes", |b| {
        b.iter_custom(|iters| {
            record("shared/scheduler-classes", iters, system.block_on(scheduler_pairs(&classes, CLASSES, iters)))
        });
    });
    group.bench_function("raw scripts acquire+finish", |b| {
        b.iter_custom(|iters| {
            let elapsed = system.block_on(async {
                let start = Instant::now();
                for _ in 0..iters {
                    next_id += 1;
                    let id = format!("raw:{next_id}");
                    let acquired = gate.acquire_text(&id, lease, 0).await.expect("acquire");
                    let Admission::Granted { wave, .. } = acquired.admission else {
                        panic!("denied: {:?}", acquired.admission)
                    };
                    gate.finish_text(&id, wave, WaveSignal::Success, 0).await.expect("finish");
                }
                start.elapsed()
            });
            record("shared/raw", iters, elapsed)
        });
    });
    group.finish();
}

fn main() {
    let mut criterion = Criterion::default().configure_from_args();
    local(&mut criterion);
    shared(&mut criterion);
    criterion.final_summary();
    println!();
    println!("ratios (median over samples of the mean time per acquire + release):");
    for (name, ours, baseline, against) in [
        ("local", "local/scheduler", "local/semaphore", "tokio Semaphore"),
        ("local, max_wait 20 ms", "local/scheduler-short", "local/semaphore", "tokio Semaphore"),
        ("shared", "shared/scheduler", "shared/raw", "raw acquire + finish scripts"),
        ("shared, max_wait 20 ms", "shared/scheduler-short", "shared/raw", "raw acquire + finish scripts"),
        ("shared, classes", "shared/scheduler-classes", "shared/scheduler", "the same without classes"),
    ] {
        if let (Some(ours), Some(baseline)) = (median(ours), median(baseline)) {
            println!(
                "  {name:<22} scheduler {:>9.2} µs vs {against} {:>9.2} µs: {:.1} x",
                ours / 1e3,
                baseline / 1e3,
                ours / baseline
            );
        }
    }
    let gave_up = GAVE_UP.load(Ordering::Relaxed);
    if gave_up > 0 {
        println!("  ({gave_up} acquires with the 20 ms max_wait gave up with no contention and were asked again)");
    }
}
