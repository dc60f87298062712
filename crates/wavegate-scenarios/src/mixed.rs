//! The mixed workload of priority classes: four real worker processes on one Redis against one
//! mock provider (limit 10). Two of them flood the upstream with batch calls (150 callers
//! each, so well over 200 wait at all times), the two others send interactive calls at a
//! steady rate. Run once with classes (`interactive` weight 3, `batch` weight 1) and once
//! without (one FIFO, today's behaviour before classes), it reports each class's permit wait,
//! the grants, the provider's own count of calls at once and the script calls per permit, and
//! draws the permit wait per class over time.
//!
//! ```text
//! cargo run --release -p wavegate-scenarios -- mixed            # 20 s per run
//! cargo run --release -p wavegate-scenarios -- mixed --secs 6   # a short one
//! ```

use std::fmt::Write as _;
use std::io::{BufRead, Write};
use std::net::SocketAddr;
use std::process::ExitCode;
use std::rc::Rc;
use std::time::{Duration, Instant};

use wavegate::{Mode, Scheduler, Upstream, UpstreamConfig};
use wavegate_testkit::{MockUpstream, MockUpstreamConfig, RedisServer, http_get};

use crate::process_fleet::{ProcessFleet, option};
use crate::redis_stats::CommandStats;
use crate::stats::percentile;

/// The limit of the run.
const LIMIT: u32 = 10;
/// Batch callers in each flooding process.
const BATCH_CALLERS: usize = 150;

const ENV_REDIS: &str = "WAVEGATE_MIXED_REDIS";
const ENV_PROVIDER: &str = "WAVEGATE_MIXED_PROVIDER";
const ENV_KIND: &str = "WAVEGATE_MIXED_KIND";
const ENV_CLASSES: &str = "WAVEGATE_MIXED_CLASSES";
const ENV_SECS: &str = "WAVEGATE_MIXED_SECS";
const ENV_RATE: &str = "WAVEGATE_MIXED_RATE";

/// The upstream's configuration, with or without classes.
fn config(classes: bool) -> Result<UpstreamConfig, String> {
    let builder = UpstreamConfig::builder("llm").limit(LIMIT).max_wait(Duration::from_secs(120));
    let builder =
        if classes { builder.class("interactive", 3).class("batch", 1).default_class("batch") } else { builder };
    builder.build().map_err(|e| e.to_string())
}

/// One finished call, as a worker reports it.
#[derive(Debug, Clone, Copy)]
struct Call {
    interactive: bool,
    /// When it was asked for, since the start (s).
    at_s: f64,
    /// Its permit wait (ms): queue and permit wait of all its attempts.
    wait_ms: f64,
    ok: bool,
}

impl Call {
    fn line(&self) -> String {
        let kind = if self.interactive { "interactive" } else { "batch" };
        format!("call {kind} {:.4} {:.3} {}", self.at_s, self.wait_ms, u8::from(self.ok))
    }

    fn parse(line: &str) -> Option<Self> {
        let mut words = line.strip_prefix("call ")?.split(' ');
        let interactive = words.next()? == "interactive";
        let at_s = words.next()?.parse().ok()?;
        let wait_ms = words.next()?.parse().ok()?;
        let ok = words.next()? == "1";
        Some(Self { interactive, at_s, wait_ms, ok })
    }
}

/// The worker role: `ready` once in shared mode, then on `go` calls for `secs` seconds and
/// prints every call, then `done`.
pub(crate) fn worker_main() -> ExitCode {
    match worker() {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("mixed worker: {error}");
            ExitCode::FAILURE
        }
    }
}

fn env(key: &str) -> Result<String, String> {
    std::env::var(key).map_err(|_| format!("{key} is not set"))
}

fn worker() -> Result<(), String> {
    let redis = env(ENV_REDIS)?;
    let provider: SocketAddr = env(ENV_PROVIDER)?.parse().map_err(|e| format!("provider address: {e}"))?;
    let interactive = env(ENV_KIND)? == "interactive";
    let classes = env(ENV_CLASSES)? == "1";
    let secs: f64 = env(ENV_SECS)?.parse().map_err(|e| format!("secs: {e}"))?;
    let rate: f64 = env(ENV_RATE)?.parse().map_err(|e| format!("rate: {e}"))?;
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| e.to_string())?;
    let local = tokio::task::LocalSet::new();
    local.block_on(&runtime, async move {
        let scheduler =
            Scheduler::builder().upstream(config(classes)?).redis(redis).build().map_err(|e| e.to_string())?;
        let started = Instant::now();
        while scheduler.mode().await.map_err(|e| e.to_string())? != Mode::Shared {
            if started.elapsed() > Duration::from_secs(10) {
                return Err("not in shared mode after 10 s".to_string());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        println!("ready");
        let mut line = String::new();
        std::io::stdin().lock().read_line(&mut line).map_err(|e| e.to_string())?;
        let llm = scheduler.upstream("llm").map_err(|e| e.to_string())?;
        let start = Instant::now();
        let end = start + Duration::from_secs_f64(secs);
        let out = Rc::new(std::cell::RefCell::new(Vec::new()));
        let mut tasks = Vec::new();
        if interactive {
            let every = Duration::from_secs_f64(1.0 / rate);
            let mut next = start;
            while next < end {
                tokio::time::sleep_until(next.into()).await;
                let (llm, out) = (llm.clone(), out.clone());
                tasks.push(tokio::task::spawn_local(async move {
                    let call = one_call(&llm, provider, true, classes, start).await;
                    out.borrow_mut().push(call);
                }));
                next += every;
            }
        } else {
            for _ in 0..BATCH_CALLERS {
                let (llm, out) = (llm.clone(), out.clone());
                tasks.push(tokio::task::spawn_local(async move {
                    while Instant::now() < end {
                        let call = one_call(&llm, provider, false, classes, start).await;
                        out.borrow_mut().push(call);
                    }
                }));
            }
        }
        for task in tasks {
            task.await.map_err(|e| e.to_string())?;
        }
        let mut stdout = std::io::stdout().lock();
        for call in out.borrow().iter() {
            writeln!(stdout, "{}", call.line()).map_err(|e| e.to_string())?;
        }
        writeln!(stdout, "done").map_err(|e| e.to_string())?;
        Ok(())
    })
}

async fn one_call(llm: &Upstream, provider: SocketAddr, interactive: bool, classes: bool, start: Instant) -> Call {
    let asked = Instant::now();
    let mut wait = Duration::ZERO;
    let request = llm.request();
    let request = match (classes, interactive) {
        (true, true) => request.priority("interactive"),
        (true, false) => request.priority("batch"),
        (false, _) => request,
    };
    let reply = request
        .call(|attempt| {
            wait += attempt.waited;
            http_get(provider, "/", Duration::from_secs(10))
        })
        .await;
    Call {
        interactive,
        at_s: asked.duration_since(start).as_secs_f64(),
        wait_ms: wait.as_secs_f64() * 1000.0,
        ok: reply.is_ok_and(|r| r.status == 200),
    }
}

/// What one run (with or without classes) measured.
struct Run {
    classes: bool,
    calls: Vec<Call>,
    max_in_flight: usize,
    scripts_per_permit: f64,
}

impl Run {
    fn waits(&self, interactive: bool) -> Vec<f64> {
        self.calls.iter().filter(|c| c.interactive == interactive && c.ok).map(|c| c.wait_ms).collect()
    }
}

/// The runner of the mixed workload (`mixed [--secs N] [--service-ms N] [--rate N]`).
pub(crate) fn runner_main(args: &[String]) -> ExitCode {
    match run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("wavegate-scenarios mixed: {error}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: &[String]) -> Result<(), String> {
    let secs = option(args, "--secs", 20.0)?;
    let service_ms = option(args, "--service-ms", 100.0)?;
    let rate = option(args, "--rate", 5.0)?;
    let out = args.iter().position(|a| a == "--out").and_then(|i| args.get(i + 1)).map_or("docs/img", String::as_str);
    let redis = RedisServer::start().map_err(|e| e.to_string())?;
    let service = Duration::from_secs_f64(service_ms / 1000.0);
    let provider = MockUpstream::start(MockUpstreamConfig { service_time: service, ..Default::default() })
        .map_err(|e| format!("mock provider: {e}"))?;
    println!(
        "# mixed workload: limit {LIMIT}, {service_ms} ms calls, 2 processes x {BATCH_CALLERS} batch callers, \
         2 processes x {rate} interactive calls/s, {secs} s per run"
    );
    let mut runs = Vec::new();
    for classes in [true, false] {
        let mut con = redis.connection().map_err(|e| e.to_string())?;
        redis::cmd("FLUSHALL").exec(&mut con).map_err(|e| e.to_string())?;
        redis::cmd("CONFIG").arg("RESETSTAT").exec(&mut con).map_err(|e| e.to_string())?;
        provider.reset_max_in_flight();
        let calls = run_fleet(&redis.url(), provider.addr(), classes, secs, rate)?;
        let stats = CommandStats::read(&mut con).map_err(|e| e.to_string())?;
        let granted = calls.len().max(1) as f64;
        runs.push(Run {
            classes,
            calls,
            max_in_flight: provider.max_in_flight(),
            scripts_per_permit: stats.calls.get("evalsha").copied().unwrap_or(0) as f64 / granted,
        });
    }
    println!();
    println!(
        "| run | interactive calls | interactive wait p50 / p99 (ms) | batch calls | batch wait p50 / p99 (ms) | batch share of grants | max at the provider | script calls per permit | failed |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for run in &runs {
        let (mut i, mut b) = (run.waits(true), run.waits(false));
        let p = |v: &mut Vec<f64>, q| percentile(v, q).unwrap_or(f64::NAN);
        let batch = b.len() as f64;
        let failed = run.calls.iter().filter(|c| !c.ok).count();
        println!(
            "| {} | {} | {:.0} / {:.0} | {} | {:.0} / {:.0} | {:.0} % | {} | {:.2} | {failed} |",
            if run.classes { "classes (interactive 3, batch 1)" } else { "one FIFO (no classes)" },
            i.len(),
            p(&mut i, 50.0),
            p(&mut i, 99.0),
            b.len(),
            p(&mut b, 50.0),
            p(&mut b, 99.0),
            100.0 * batch / (batch + i.len() as f64).max(1.0),
            run.max_in_flight,
            run.scripts_per_permit,
        );
    }
    std::fs::create_dir_all(out).map_err(|e| e.to_string())?;
    let path = format!("{out}/mixed.svg");
    std::fs::write(&path, draw(&runs, secs, service_ms)).map_err(|e| format!("{path}: {e}"))?;
    println!("\npicture: {path}");
    Ok(())
}

/// Starts the four workers, starts them together, collects their calls.
fn run_fleet(redis: &str, provider: SocketAddr, classes: bool, secs: f64, rate: f64) -> Result<Vec<Call>, String> {
    let kinds = ["batch", "batch", "interactive", "interactive"];
    let mut fleet = ProcessFleet::spawn("mixed-worker", kinds.len(), |i| {
        vec![
            (ENV_REDIS, redis.to_owned()),
            (ENV_PROVIDER, provider.to_string()),
            (ENV_KIND, kinds[i].to_owned()),
            (ENV_CLASSES, if classes { "1" } else { "0" }.to_owned()),
            (ENV_SECS, secs.to_string()),
            (ENV_RATE, rate.to_string()),
        ]
    })?;
    fleet.wait_all("ready", Duration::from_secs(20), |_| {})?;
    fleet.send_all("go")?;
    let mut calls = Vec::new();
    fleet.wait_all("done", Duration::from_secs_f64(secs + 150.0), |line| calls.extend(Call::parse(line)))?;
    Ok(calls)
}

/// The picture: per run, every call's permit wait over time (log scale), by class.
fn draw(runs: &[Run], secs: f64, service_ms: f64) -> String {
    const WIDTH: f64 = 960.0;
    const LEFT: f64 = 64.0;
    const PANEL: f64 = 220.0;
    const TOP: f64 = 56.0;
    const PLOT: f64 = 170.0;
    let plot_width = WIDTH - LEFT - 24.0;
    let height = TOP + PANEL * runs.len() as f64 + 20.0;
    let (lo, hi) = (1.0f64.log10(), 100_000.0f64.log10());
    let y = |top: f64, ms: f64| top + PLOT - (ms.max(1.0).log10() - lo) / (hi - lo) * PLOT;
    let mut svg = String::new();
    let _ = writeln!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" viewBox="0 0 {WIDTH} {height}" font-family="sans-serif" font-size="11"><rect width="{WIDTH}" height="{height}" fill="white"/>"#
    );
    let _ = writeln!(
        svg,
        r##"<text x="{LEFT}" y="20" font-size="14" font-weight="bold">mixed: a batch flood in two processes, interactive calls in two others (limit {LIMIT}, {service_ms} ms calls)</text><text x="{LEFT}" y="38">Each dot is one call's permit wait (log scale) at the time it was asked for: <tspan fill="#d62728">interactive</tspan>, <tspan fill="#1f5fa8">batch</tspan>. The dashed line is 2 x the service time.</text>"##
    );
    for (k, run) in runs.iter().enumerate() {
        let top = TOP + PANEL * k as f64;
        let title = if run.classes {
            "with classes: interactive weight 3, batch weight 1"
        } else {
            "without classes: one FIFO"
        };
        let _ = writeln!(svg, r#"<text x="{LEFT}" y="{}" font-weight="bold">{title}</text>"#, top - 4.0);
        let _ = writeln!(
            svg,
            r##"<rect x="{LEFT}" y="{top}" width="{plot_width}" height="{PLOT}" fill="none" stroke="#999"/>"##
        );
        for ms in [1.0, 10.0, 100.0, 1_000.0, 10_000.0, 100_000.0] {
            let yy = y(top, ms);
            let label = if ms >= 1000.0 { format!("{} s", ms / 1000.0) } else { format!("{ms} ms") };
            let _ = writeln!(
                svg,
                r##"<line x1="{LEFT}" x2="{}" y1="{yy:.1}" y2="{yy:.1}" stroke="#eee"/><text x="{}" y="{:.1}" text-anchor="end">{label}</text>"##,
                LEFT + plot_width,
                LEFT - 4.0,
                yy + 4.0
            );
        }
        let bound = y(top, 2.0 * service_ms);
        let _ = writeln!(
            svg,
            r##"<line x1="{LEFT}" x2="{}" y1="{bound:.1}" y2="{bound:.1}" stroke="#333" stroke-dasharray="4 3"/>"##,
            LEFT + plot_width
        );
        for interactive in [false, true] {
            let color = if interactive { "#d62728" } else { "#1f5fa8" };
            let _ = write!(svg, r#"<g fill="{color}" fill-opacity="0.5">"#);
            for call in run.calls.iter().filter(|c| c.interactive == interactive) {
                let x = LEFT + (call.at_s / secs).min(1.0) * plot_width;
                let _ = write!(svg, r#"<circle cx="{x:.1}" cy="{:.1}" r="1.5"/>"#, y(top, call.wait_ms));
            }
            let _ = writeln!(svg, "</g>");
        }
        let _ = writeln!(
            svg,
            r#"<text x="{}" y="{}" text-anchor="end">{secs} s</text>"#,
            LEFT + plot_width,
            top + PLOT + 14.0
        );
    }
    let _ = writeln!(svg, "</svg>");
    svg
}
