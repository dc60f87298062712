//! How soon a caller that cannot make its deadline is told (issue 23: "within 10 ms of
//! asking"): the time from `acquire()` to the refusal, measured over many callers.
//!
//! Run it in release: `cargo run --release --example deadline_refusals` (it starts its own
//! redis-server on a free loopback port for the shared-mode rows). Each row spends a requests
//! budget (one request a minute, burst 1) and then asks with a 500 ms deadline, which no permit
//! can meet for a minute:
//!
//! * `local`: local mode, refused at admission by the in-process gate's proof;
//! * `shared, heard`: shared mode, refused at admission on the store's denial heard within
//!   100 ms;
//! * `shared, asked`: shared mode, the denial heard over 100 ms ago: the caller is queued, the
//!   store asked again at once, and the caller refused on its answer (one round trip).

use std::time::{Duration, Instant};

use wavegate::{ErrorKind, Scheduler, Upstream, UpstreamConfig};
use wavegate_testkit::RedisServer;

fn upstream() -> UpstreamConfig {
    UpstreamConfig::builder("llm").limit(10).requests_per_minute(1, 1).build().expect("valid")
}

/// `n` refusals of `llm`, each `pause` after the last: the time from the ask to each.
async fn refusals(llm: &Upstream, n: usize, pause: Duration) -> Vec<Duration> {
    let mut took = Vec::with_capacity(n);
    for _ in 0..n {
        tokio::time::sleep(pause).await;
        let started = Instant::now();
        let error =
            llm.request().timeout(Duration::from_millis(500)).acquire().await.expect_err("no room for a minute");
        took.push(started.elapsed());
        assert_eq!(error.kind(), ErrorKind::DeadlinePassed, "{error:?}");
        assert!(error.needed().is_some(), "refused early: {error:?}");
    }
    took
}

fn row(name: &str, mut took: Vec<Duration>) {
    took.sort();
    let at = |q: f64| took[((took.len() - 1) as f64 * q).round() as usize];
    println!(
        "| {name} | {} | {:.3} | {:.3} | {:.3} |",
        took.len(),
        at(0.5).as_secs_f64() * 1e3,
        at(0.99).as_secs_f64() * 1e3,
        took[took.len() - 1].as_secs_f64() * 1e3
    );
}

#[actix::main]
async fn main() {
    println!("| ask to refusal | callers | p50 ms | p99 ms | max ms |\n|---|---|---|---|---|");
    let local = Scheduler::builder().upstream(upstream()).build().expect("scheduler");
    let llm = local.upstream("llm").expect("configured");
    llm.request().acquire().await.expect("the burst").succeeded();
    row("local", refusals(&llm, 2_000, Duration::ZERO).await);

    let redis = RedisServer::start().expect("redis-server");
    let build = || Scheduler::builder().upstream(upstream()).redis(redis.url()).build().expect("scheduler");
    let (a, b) = (build(), build());
    a.upstream("llm").expect("configured").request().acquire().await.expect("the burst").succeeded();
    let llm = b.upstream("llm").expect("configured");
    // The first refusal hears the store's denial; those within 100 ms of it need no store call.
    let mut heard = Vec::new();
    while heard.len() < 2_000 {
        let mut batch = refusals(&llm, 50, Duration::ZERO).await;
        heard.extend(batch.drain(1..));
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    row("shared, heard", heard);
    row("shared, asked", refusals(&llm, 200, Duration::from_millis(150)).await);
}
