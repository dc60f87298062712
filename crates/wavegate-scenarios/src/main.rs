//! The scenario runner: the same job list, sent to a rate-limited mock provider by a fleet of
//! worker processes, under each strategy — naive per-request retries, a per-process
//! semaphore, and wavegate — with a table and a picture per scenario.
//!
//! ```text
//! cargo run --release -p wavegate-scenarios               # the full run (see docs/benchmarks.md)
//! cargo run --release -p wavegate-scenarios -- --quick    # a smoke run of every scenario
//! cargo run --release -p wavegate-scenarios -- --help     # every option
//! cargo run --release -p wavegate-scenarios -- mixed      # priority classes under a batch flood
//! cargo run --release -p wavegate-scenarios -- scale      # 32 processes, 100 upstreams, one Redis
//! cargo run --release -p wavegate-scenarios --features cluster -- scale --cluster   # then a 3-master cluster
//! cargo run --release -p wavegate-scenarios -- shadow     # shadow mode's "would have" against enforcing
//! ```
//!
//! One binary plays three roles, chosen by the `WAVEGATE_SCENARIO_ROLE` environment variable:
//! the **runner** (no role: it starts everything, hands out jobs, breaks things on schedule and
//! reports), the **provider** (a mock HTTP API on loopback with a hidden concurrency cap that
//! records every request) and the **worker** (one process of the fleet, running one strategy
//! with several concurrent callers). The runner re-executes itself for the other two.

mod cli;
mod llm_report;
mod mixed;
mod nginx;
mod oracle;
mod process_fleet;
mod protocol;
mod provider;
mod redis_stats;
mod report;
mod runner;
mod scale;
mod scale_worker;
mod scenario;
mod shadow;
mod stats;
mod strategy;
mod svg;
mod worker;

use std::process::ExitCode;

/// The environment variable that makes this binary a provider or a worker.
const ROLE_ENV: &str = "WAVEGATE_SCENARIO_ROLE";

fn main() -> ExitCode {
    match std::env::var(ROLE_ENV).as_deref() {
        Ok("provider") => provider::main(),
        Ok("worker") => worker::main(),
        Ok("mixed-worker") => mixed::worker_main(),
        Ok("scale-worker") => scale_worker::worker_main(),
        Ok(other) => {
            eprintln!("unknown {ROLE_ENV}={other:?} (expected `provider` or `worker`)");
            ExitCode::FAILURE
        }
        Err(_) => {
            let args: Vec<String> = std::env::args().skip(1).collect();
            match args.first().map(String::as_str) {
                Some("mixed") => mixed::runner_main(&args[1..]),
                Some("scale") => scale::runner_main(&args[1..]),
                Some("shadow") => shadow::runner_main(&args[1..]),
                _ => runner::main(),
            }
        }
    }
}
