//! A simulated fleet calling a provider that answers 429 beyond a hidden capacity, scheduled
//! by wavegate's policy (the wave machine and permit gate of local mode) on a simulated clock.
//!
//! Run it with `cargo run --example simulate`. It prints every change of the wave state and a
//! summary: how many calls succeeded, how many 429s the fleet drew and absorbed, how many late
//! 429s were ignored instead of cutting the limit again, and the most calls the provider ever
//! saw at once. Options: `--jobs N`, `--callers N`, `--capacity N`, `--limit N`, `--seed N`,
//! `--recovery seed|adaptive`.

use std::collections::VecDeque;
use std::time::SystemTime;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use wavegate_core::{Admission, DenyReason, LocalGate, Outcome, RateLimitEffect, Recovery, UpstreamConfig, WaveState};

const TICK_MS: u64 = 5;

struct Options {
    jobs: usize,
    callers: usize,
    capacity: usize,
    limit: u32,
    seed: u64,
    recovery: Recovery,
}

fn parse_options() -> Result<Options, String> {
    let mut options =
        Options { jobs: 400, callers: 40, capacity: 8, limit: 10, seed: 7, recovery: Recovery::default() };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let value = args.next().ok_or_else(|| format!("{flag} needs a value"))?;
        if flag == "--recovery" {
            options.recovery = match value.as_str() {
                "seed" => Recovery::Seed,
                "adaptive" => Recovery::Adaptive,
                other => return Err(format!("--recovery: {other:?} is not seed or adaptive")),
            };
            continue;
        }
        let number = value.parse::<u64>().map_err(|_| format!("{flag}: {value:?} is not a number"))?;
        match flag.as_str() {
            "--jobs" => options.jobs = number as usize,
            "--callers" => options.callers = number.max(1) as usize,
            "--capacity" => options.capacity = number.max(1) as usize,
            "--limit" => options.limit = u32::try_from(number).map_err(|_| "--limit is too large".to_string())?,
            "--seed" => options.seed = number,
            other => {
                return Err(format!(
                    "unknown option {other}; use --jobs, --callers, --capacity, --limit, --seed, --recovery"
                ));
            }
        }
    }
    Ok(options)
}

/// A call in flight at the provider.
struct InFlight {
    job: usize,
    permit: String,
    wave: u64,
    ends_ms: u64,
    outcome: Outcome,
}

fn main() {
    let options = match parse_options() {
        Ok(options) => options,
        Err(message) => {
            eprintln!("{message}");
            std::process::exit(2);
        }
    };
    let config = match UpstreamConfig::builder("simulated-llm").limit(options.limit).recovery(options.recovery).build()
    {
        Ok(config) => config,
        Err(error) => {
            eprintln!("{error}");
            std::process::exit(2);
        }
    };
    let mut rng = StdRng::seed_from_u64(options.seed);
    let mut gate = LocalGate::new(config.wave().clone());
    let lease_ms = config.permit_ttl().as_millis() as u64;

    println!(
        "wavegate policy simulation: {} jobs, {} callers, provider capacity {} (hidden), configured limit {}, {} recovery",
        options.jobs,
        options.callers,
        options.capacity,
        options.limit,
        options.recovery.as_str()
    );
    println!("{:>8}  {:<9} → {:<9} {:>5} {:>5}  why", "time", "from", "to", "limit", "wave");

    let mut pending: VecDeque<usize> = (0..options.jobs).collect();
    let mut waiting: VecDeque<usize> = VecDeque::new();
    let mut in_flight: Vec<InFlight> = Vec::new();
    let (mut attempts, mut succeeded, mut rate_limited, mut late, mut max_seen) = (0u64, 0u64, 0u64, 0u64, 0usize);
    let mut wait_until_ms = 0u64;
    let mut now_ms = 0u64;
    let mut last = gate.status(0).0;

    while succeeded < options.jobs as u64 {
        // Calls that end now report their outcome and release their permit.
        let (done, running): (Vec<_>, Vec<_>) = in_flight.drain(..).partition(|call| call.ends_ms <= now_ms);
        in_flight = running;
        for call in done {
            let report = gate.finish_text(&call.permit, call.wave, call.outcome.wave_signal(), now_ms);
            match report.rate_limit {
                Some(RateLimitEffect::Late { .. }) => late += 1,
                Some(RateLimitEffect::Cut { .. }) | None => {}
            }
            if matches!(call.outcome, Outcome::Success { .. }) {
                succeeded += 1;
            } else {
                waiting.push_front(call.job); // retried through a new permit
            }
        }
        // Callers take jobs while they are free.
        while waiting.len() + in_flight.len() < options.callers {
            match pending.pop_front() {
                Some(job) => waiting.push_back(job),
                None => break,
            }
        }
        // Waiters ask for permits in FIFO order.
        if now_ms >= wait_until_ms {
            while let Some(&job) = waiting.front() {
                attempts += 1;
                let permit = format!("job{job}-attempt{attempts}");
                match gate.acquire_text(&permit, now_ms, lease_ms) {
                    Admission::Granted { wave, .. } => {
                        waiting.pop_front();
                        let busy = in_flight.len() + 1;
                        max_seen = max_seen.max(busy);
                        let outcome = if busy > options.capacity {
                            rate_limited += 1;
                            Outcome::from_status(429, Some("1"), SystemTime::now())
                        } else {
                            Outcome::from_status(200, None, SystemTime::now())
                        };
                        let service_ms = if busy > options.capacity { 20 } else { rng.random_range(200..400) };
                        in_flight.push(InFlight { job, permit, wave, ends_ms: now_ms + service_ms, outcome });
                    }
                    Admission::Denied { reason, retry_after_ms } => {
                        attempts -= 1;
                        if reason == DenyReason::Cooldown {
                            wait_until_ms = now_ms + retry_after_ms;
                        }
                        break;
                    }
                }
            }
        }
        let (now, _) = gate.status(now_ms);
        if (now.state, now.limit, now.wave) != (last.state, last.limit, last.wave) {
            let why = match (last.state, now.state) {
                (_, WaveState::Cooldown) => "429 of the current wave: cut and cool down".to_string(),
                (WaveState::Cooldown, WaveState::Probe) => "cooldown over".to_string(),
                (WaveState::Probe, _) => "probe successes".to_string(),
                _ if now.wave != last.wave => {
                    "429 above what held: step back, nobody else stops (the rejected call waits)".to_string()
                }
                _ => format!("{} successes at limit {}", last.limit, last.limit),
            };
            println!(
                "{:>7.2}s  {:<9} → {:<9} {:>5} {:>5}  {why}",
                now_ms as f64 / 1000.0,
                last.state.as_str(),
                now.state.as_str(),
                now.limit,
                now.wave
            );
            last = now;
        }
        now_ms += TICK_MS;
    }

    let ideal_s = options.jobs as f64 * 0.3 / options.capacity as f64;
    println!();
    println!("succeeded           {succeeded} of {}", options.jobs);
    println!("attempts            {attempts}");
    println!(
        "429s drawn          {rate_limited} ({:.1} % of attempts), all retried",
        100.0 * rate_limited as f64 / attempts as f64
    );
    println!("late 429s ignored   {late}");
    println!("max in flight seen  {max_seen} (provider capacity {}, limit {})", options.capacity, options.limit);
    println!(
        "completion          {:.1} s simulated (ideal {ideal_s:.1} s, ratio {:.2})",
        now_ms as f64 / 1000.0,
        now_ms as f64 / 1000.0 / ideal_s
    );
    println!("final state         {} at limit {}, wave {}", last.state, last.limit, last.wave);
}
