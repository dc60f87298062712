//! wavegate in an actix-web app, against a simulated LLM provider with a hidden capacity.
//!
//! ```text
//! cargo run -p wavegate-web --example demo                 # a burst of requests, then a summary
//! cargo run -p wavegate-web --example demo -- --serve      # keep serving on 127.0.0.1:8080
//! REDIS_URL=redis://127.0.0.1:6379/ cargo run -p wavegate-web --features redis --example demo   # shared mode
//! ```
//!
//! Options: `--requests N` (300), `--concurrency N` (60), `--capacity N` (the provider's hidden
//! capacity, 6), `--limit N` (the configured limit, 10), `--recovery seed|adaptive` (adaptive). With `REDIS_URL` set (and
//! `--features redis`) the scheduler runs in shared mode; without it, in local mode (the embedded default).
//!
//! The provider answers 429 with `Retry-After: 1` whenever more calls than its capacity arrive
//! at once; the scheduler absorbs them (a step back of the limit, a retry through a new permit) so the
//! app's clients see answers, not errors.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant, SystemTime};

use actix_web::{App, HttpResponse, HttpServer, web};
use rand::Rng;
use wavegate::config::Recovery;
use wavegate::{Outcome, Scheduler, SchedulerBuilder, Upstream, UpstreamConfig};
use wavegate_testkit::http_get;
use wavegate_web::{METRICS_PATH, PAGE_PATH, STATUS_PATH, WebError, configure, install_prometheus};

/// A provider that can serve `capacity` calls at once and answers 429 beyond that.
#[derive(Debug, Default)]
struct SimulatedProvider {
    capacity: usize,
    busy: AtomicUsize,
    max_busy: AtomicUsize,
    served: AtomicU64,
    rate_limited: AtomicU64,
}

impl SimulatedProvider {
    async fn complete(&self) -> Result<String, Outcome> {
        let busy = self.busy.fetch_add(1, Ordering::SeqCst) + 1;
        self.max_busy.fetch_max(busy, Ordering::SeqCst);
        let result = if busy > self.capacity {
            self.rate_limited.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(5)).await;
            Err(Outcome::from_status(429, Some("1"), SystemTime::now()))
        } else {
            let think = rand::rng().random_range(80..200);
            tokio::time::sleep(Duration::from_millis(think)).await;
            self.served.fetch_add(1, Ordering::SeqCst);
            Ok(format!("an answer that took {think} ms"))
        };
        self.busy.fetch_sub(1, Ordering::SeqCst);
        result
    }
}

async fn ask(llm: web::Data<Upstream>, provider: web::Data<Arc<SimulatedProvider>>) -> Result<HttpResponse, WebError> {
    // The call runs in this handler's task: the closure borrows the provider and these locals.
    let (mut waited, mut attempts) = (Duration::ZERO, 0);
    let answer = llm
        .request()
        .call(|attempt| {
            waited += attempt.waited;
            attempts = attempt.number;
            provider.complete()
        })
        .await?;
    Ok(HttpResponse::Ok().json(serde_json::json!({
        "answer": answer,
        "attempts": attempts,
        "waited_ms": waited.as_millis() as u64,
    })))
}

struct Options {
    serve: bool,
    requests: usize,
    concurrency: usize,
    capacity: usize,
    limit: u32,
    recovery: Recovery,
}

fn options() -> Result<Options, String> {
    let mut options =
        Options { serve: false, requests: 300, concurrency: 60, capacity: 6, limit: 10, recovery: Recovery::default() };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        if flag == "--serve" {
            options.serve = true;
            continue;
        }
        let value = args.next().ok_or_else(|| format!("{flag} needs a value"))?;
        if flag == "--recovery" {
            options.recovery = match value.as_str() {
                "seed" => Recovery::Seed,
                "adaptive" => Recovery::Adaptive,
                other => return Err(format!("--recovery: {other:?} is not seed or adaptive")),
            };
            continue;
        }
        let number: usize = value.parse().map_err(|_| format!("{flag}: {value:?} is not a number"))?;
        match flag.as_str() {
            "--requests" => options.requests = number,
            "--concurrency" => options.concurrency = number.max(1),
            "--capacity" => options.capacity = number.max(1),
            "--limit" => options.limit = u32::try_from(number).map_err(|_| "--limit is too large")?,
            other => return Err(format!("unknown option {other}; see the top of examples/demo.rs")),
        }
    }
    Ok(options)
}

/// Shared mode through the Redis at `url` (feature `redis`).
#[cfg(feature = "redis")]
fn shared(builder: SchedulerBuilder, url: &str) -> std::io::Result<SchedulerBuilder> {
    Ok(builder.redis(url))
}

#[cfg(not(feature = "redis"))]
fn shared(_: SchedulerBuilder, _: &str) -> std::io::Result<SchedulerBuilder> {
    Err(std::io::Error::other(
        "REDIS_URL is set but this build has no Redis: run the demo with `--features redis` (or unset REDIS_URL)",
    ))
}

#[actix_web::main]
async fn main() -> std::io::Result<()> {
    let options = options().map_err(std::io::Error::other)?;
    let metrics = install_prometheus().map_err(std::io::Error::other)?;
    let redis = std::env::var("REDIS_URL").ok();
    let mut builder = Scheduler::builder().upstream(
        UpstreamConfig::builder("llm")
            .limit(options.limit)
            .recovery(options.recovery)
            .renewed_lease(Duration::from_secs(30))
            .call_timeout(Duration::from_secs(30))
            .build()
            .map_err(std::io::Error::other)?,
    );
    if let Some(url) = &redis {
        builder = shared(builder, url)?;
    }
    let scheduler = builder.build().map_err(std::io::Error::other)?;
    let provider = Arc::new(SimulatedProvider { capacity: options.capacity, ..SimulatedProvider::default() });

    let app_scheduler = scheduler.clone();
    let llm = scheduler.upstream("llm").map_err(std::io::Error::other)?;
    let app_provider = provider.clone();
    let server = HttpServer::new(move || {
        App::new()
            .app_data(web::Data::new(app_scheduler.clone()))
            .app_data(web::Data::new(llm.clone()))
            .app_data(web::Data::new(app_provider.clone()))
            .app_data(web::Data::new(metrics.clone()))
            .route("/ask", web::get().to(ask))
            .configure(configure)
    })
    .workers(2)
    .bind(("127.0.0.1", if options.serve { 8080 } else { 0 }))?;
    let addr = server.addrs()[0];
    let mode = if redis.is_some() { "shared mode (REDIS_URL)" } else { "local mode (no REDIS_URL)" };
    if options.serve {
        println!(
            "wavegate demo, {mode}: GET http://{addr}/ask, {STATUS_PATH}, {METRICS_PATH}, the status page {PAGE_PATH}"
        );
        return server.run().await;
    }
    let running = server.run();
    let handle = running.handle();
    actix_web::rt::spawn(running);

    println!(
        "wavegate demo, {mode}: provider capacity {} (hidden), configured limit {}",
        options.capacity, options.limit
    );
    println!("{} requests, {} at a time, over real HTTP to http://{addr}/ask", options.requests, options.concurrency);
    let started = Instant::now();
    let next = Arc::new(AtomicUsize::new(0));
    let mut clients = Vec::new();
    for _ in 0..options.concurrency {
        let next = next.clone();
        let total = options.requests;
        clients.push(actix_web::rt::spawn(async move {
            let mut seen = Vec::new();
            while next.fetch_add(1, Ordering::SeqCst) < total {
                let sent = Instant::now();
                let reply = http_get(addr, "/ask", Duration::from_secs(120)).await;
                let latency = sent.elapsed();
                let (status, waited) = match reply {
                    Ok(reply) => {
                        let body: serde_json::Value = serde_json::from_str(&reply.body).unwrap_or_default();
                        (reply.status, body["waited_ms"].as_u64().unwrap_or(0))
                    }
                    Err(_) => (0, 0),
                };
                seen.push((status, latency, waited));
            }
            seen
        }));
    }
    let mut results = Vec::new();
    for client in clients {
        results.extend(client.await.unwrap_or_default());
    }
    let elapsed = started.elapsed();

    let ok = results.iter().filter(|r| r.0 == 200).count();
    let unavailable = results.iter().filter(|r| r.0 == 503).count();
    let mut latencies: Vec<Duration> = results.iter().map(|r| r.1).collect();
    let mut waits: Vec<u64> = results.iter().filter(|r| r.0 == 200).map(|r| r.2).collect();
    latencies.sort();
    waits.sort_unstable();
    let pct = |n: usize, p: f64| ((n as f64 * p).ceil() as usize).clamp(1, n.max(1)) - 1;
    let latency = |p: f64| latencies.get(pct(latencies.len(), p)).copied().unwrap_or_default();
    let wait = |p: f64| waits.get(pct(waits.len(), p)).copied().unwrap_or_default();
    let status = wavegate_web::status(&scheduler).await.map_err(std::io::Error::other)?;
    let llm = &status.upstreams[0];

    println!();
    println!(
        "  succeeded             {ok} / {}  (503s: {unavailable}, other: {})",
        results.len(),
        results.len() - ok - unavailable
    );
    println!(
        "  provider 429s         {} drawn, all absorbed by the scheduler (each retried through a new permit)",
        provider.rate_limited.load(Ordering::SeqCst)
    );
    println!("  provider max busy     {} (capacity {})", provider.max_busy.load(Ordering::SeqCst), options.capacity);
    println!(
        "  latency p50 / p99     {:.0} ms / {:.0} ms",
        latency(0.5).as_secs_f64() * 1e3,
        latency(0.99).as_secs_f64() * 1e3
    );
    println!("  permit wait p50 / p99 {} ms / {} ms", wait(0.5), wait(0.99));
    println!(
        "  throughput            {:.1} requests/s over {:.1} s",
        results.len() as f64 / elapsed.as_secs_f64(),
        elapsed.as_secs_f64()
    );
    println!(
        "  final state           {} at limit {} of {} (wave {}, mode {})",
        llm.state, llm.limit, llm.base_limit, llm.wave, llm.mode
    );
    println!();
    println!("GET {METRICS_PATH} (excerpt):");
    let metrics_text = http_get(addr, METRICS_PATH, Duration::from_secs(5)).await.map(|r| r.body).unwrap_or_default();
    for line in metrics_text.lines().filter(|l| excerpt(l)) {
        println!("  {line}");
    }
    handle.stop(true).await;
    Ok(())
}

/// The lines worth showing: every non-zero series but histogram buckets and sums.
fn excerpt(line: &str) -> bool {
    line.starts_with("wavegate_")
        && !line.contains("_bucket{")
        && !line.contains("_sum{")
        && line.rsplit(' ').next().is_some_and(|value| value != "0")
}
