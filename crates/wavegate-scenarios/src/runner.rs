//! The runner role: starts the provider, Redis and the workers, hands out the job list,
//! breaks things on schedule, collects what everyone recorded and reports.

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, ExitCode, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::time::{Duration, Instant};

use wavegate::config::UpstreamName;
use wavegate_redis::Keyspace;
use wavegate_testkit::{HeaderStyle, RedisServer};

use crate::cli::{self, Options, USAGE};
use crate::llm_report::{self, BucketLog};
use crate::nginx::Nginx;
use crate::protocol::{field, now_us, num};
use crate::provider::{ProviderConfig, Request};
use crate::redis_stats::{self, CommandStats};
use crate::report::{self, Crash, JobDone, Mark, RedisUse, Row, RunResult, StatusSample};
use crate::scenario::{Event, Scenario, Sizes};
use crate::strategy::{PENDING, Strategy};
use crate::worker::{UPSTREAM, WorkerEnv};
use crate::{ROLE_ENV, svg};

/// The tag of the provider's lines.
const PROVIDER: usize = usize::MAX;
/// How long every process gets to start.
const START_TIMEOUT: Duration = Duration::from_secs(60);
/// How long wavegate workers run before the start, so every heartbeat has counted the fleet
/// (heartbeats are 1 s apart): the fallback's fair share depends on it.
const HEARTBEAT_SETTLE: Duration = Duration::from_millis(1_200);

/// Runs what the command line asks for.
pub(crate) fn main() -> ExitCode {
    let options = match cli::parse(std::env::args().skip(1)) {
        Ok(Some(options)) => options,
        Ok(None) => {
            print!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(error) => {
            eprintln!("{error}");
            return ExitCode::FAILURE;
        }
    };
    match run(&options) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("wavegate-scenarios: {error}");
            ExitCode::FAILURE
        }
    }
}

fn run(options: &Options) -> Result<(), String> {
    let started = Instant::now();
    let sizes = &options.sizes;
    std::fs::create_dir_all(&options.out).map_err(|e| format!("cannot create {}: {e}", options.out.display()))?;
    println!(
        "# wavegate scenarios ({}): {} processes x {} callers, {} jobs of {}-{} ms, provider Retry-After {} s{}",
        if options.quick { "quick" } else { "full" },
        sizes.processes,
        sizes.callers,
        sizes.jobs,
        sizes.service_ms.0,
        sizes.service_ms.1,
        sizes.retry_after_s,
        sizes.rpm.map_or(String::new(), |rpm| format!(", {rpm} requests per minute")),
    );
    let mut listed: Vec<&'static Strategy> = Vec::new();
    for scenario in &options.scenarios {
        for strategy in options.strategies_for(scenario) {
            if !listed.iter().any(|s| s.name == strategy.name) {
                listed.push(strategy);
            }
        }
    }
    println!("strategies: {}", listed.iter().map(|s| s.name).collect::<Vec<_>>().join(", "));
    for strategy in &listed {
        println!("  {:<18} {}", strategy.name, strategy.summary);
    }
    for pending in PENDING {
        println!("  {:<18} NOT RUN: waits for {}", pending.name, pending.waits_for);
    }
    for scenario in &options.scenarios {
        if scenario.via_nginx && !Nginx::available() {
            println!();
            println!("## {}: NOT RUN: nginx is not installed (apt-get install nginx-light)", scenario.name);
            continue;
        }
        let scenario_started = Instant::now();
        let sizes = &sizes.for_scenario(scenario, options.quick);
        let strategies = options.strategies_for(scenario);
        println!();
        println!("## {}: {}", scenario.name, scenario.title);
        println!(
            "{} jobs of {}-{} ms; {}",
            sizes.jobs,
            sizes.service_ms.0,
            sizes.service_ms.1,
            strategies.iter().map(|s| s.name).collect::<Vec<_>>().join(", ")
        );
        let mut runs: Vec<Vec<Row>> = Vec::new();
        // The picture shows the first round, which runs every strategy (the reference ones too).
        let mut pictured = Vec::new();
        for round in 1..=options.repeat {
            let mut results = Vec::new();
            for strategy in strategies.iter().filter(|s| round == 1 || !s.reference) {
                let result = run_one(scenario, strategy, sizes)?;
                eprintln!(
                    "  [{} {round}/{}] {} done in {:.1} s (wall, setup included)",
                    scenario.name,
                    options.repeat,
                    strategy.name,
                    result.wall.as_secs_f64()
                );
                results.push(result);
            }
            println!();
            if options.repeat > 1 {
                println!("run {round} of {}:", options.repeat);
                println!();
            }
            print!("{}", report::table(scenario, sizes, &results));
            if scenario.bucket.is_some() {
                println!();
                print!("{}", llm_report::table(scenario, &results));
            }
            runs.push(results.iter().map(|r| Row::new(scenario, sizes, r)).collect());
            if round == 1 {
                pictured = results;
            }
        }
        if options.repeat > 1 {
            println!();
            print!("{}", report::medians(&runs));
        }
        let picture = options.out.join(format!("scenario-{}.svg", scenario.name));
        std::fs::write(&picture, svg::draw(scenario, sizes, &pictured))
            .map_err(|e| format!("cannot write {}: {e}", picture.display()))?;
        println!();
        println!(
            "picture: {} ({:.0} s for this scenario)",
            picture.display(),
            scenario_started.elapsed().as_secs_f64()
        );
    }
    println!();
    println!("total time: {:.0} s", started.elapsed().as_secs_f64());
    Ok(())
}

/// A line from a child, or its end (`None`).
struct Message {
    from: usize,
    line: Option<String>,
}

/// A child process of this run; killed (by its pid, through `Child::kill`) on drop.
struct Proc {
    child: Child,
    stdin: Option<ChildStdin>,
}

impl Proc {
    fn spawn(role: &str, envs: &[(&'static str, String)], tag: usize, tx: Sender<Message>) -> Result<Proc, String> {
        let exe = std::env::current_exe().map_err(|e| format!("own path: {e}"))?;
        let mut command = Command::new(exe);
        command.env(ROLE_ENV, role).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::inherit());
        for (key, value) in envs {
            command.env(key, value);
        }
        let mut child = command.spawn().map_err(|e| format!("cannot start a {role}: {e}"))?;
        let stdout = child.stdout.take().ok_or("no stdout")?;
        let stdin = child.stdin.take();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(Message { from: tag, line: Some(line) }).is_err() {
                    return;
                }
            }
            let _ = tx.send(Message { from: tag, line: None });
        });
        Ok(Proc { child, stdin })
    }

    /// Sends one line; a child that is gone is not an error here (its end is seen elsewhere).
    fn send(&mut self, line: &str) {
        if let Some(stdin) = self.stdin.as_mut()
            && writeln!(stdin, "{line}").and_then(|()| stdin.flush()).is_err()
        {
            self.stdin = None;
        }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.stdin = None;
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Waits for a line starting with `word` from `from`; hands other lines to `other`.
fn wait_for(
    rx: &Receiver<Message>,
    from: usize,
    word: &str,
    timeout: Duration,
    mut other: impl FnMut(Message),
) -> Result<String, String> {
    let deadline = Instant::now() + timeout;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(Message { from: f, line: Some(line) }) if f == from && line.starts_with(word) => return Ok(line),
            Ok(Message { from: f, line: None }) if f == from => return Err(format!("a child ended before `{word}`")),
            Ok(message) => other(message),
            Err(_) => return Err(format!("no `{word}` within {timeout:?}")),
        }
    }
}

/// One worker process and the jobs it holds.
struct WorkerSlot {
    proc: Proc,
    pid: u32,
    /// Jobs handed to it and not reported yet.
    holding: BTreeSet<u64>,
    ended: bool,
    killed: bool,
    finished: bool,
}

/// Runs the job list once under `strategy`.
fn run_one(scenario: &Scenario, strategy: &'static Strategy, sizes: &Sizes) -> Result<RunResult, String> {
    let wall = Instant::now();
    let (tx, rx) = mpsc::channel();
    let uses_redis = strategy.kind.uses_redis();
    let mut redis =
        if uses_redis { Some(RedisServer::start().map_err(|e| format!("redis-server: {e}"))?) } else { None };
    let provider_config = ProviderConfig {
        capacity: scenario.provider_phases(sizes.jobs),
        rpm: scenario.rate.map(|(calls, _)| calls).or(scenario.announced.map(|a| a.rpm)).or(sizes.rpm),
        window_s: scenario.rate.map_or(60, |(_, window)| window),
        headers: scenario.announced.and_then(|a| HeaderStyle::parse(a.style)),
        tpm: scenario.announced.map(|a| a.tpm),
        service_ms: sizes.service_ms,
        retry_after_s: (!scenario.plain_429).then_some(sizes.retry_after_s),
        bucket: scenario.bucket.map(|b| (b, if b.cap > 0 { b.cap.min(scenario.limit) } else { scenario.limit })),
    };
    let mut provider = Proc::spawn("provider", &provider_config.to_env(), PROVIDER, tx.clone())?;
    let line = wait_for(&rx, PROVIDER, "LISTENING", START_TIMEOUT, |_| {})?;
    let backend = field(&line, "addr").and_then(|a| a.parse().ok()).ok_or_else(|| format!("bad line {line:?}"))?;
    let nginx = if scenario.via_nginx { Some(Nginx::start(backend, scenario.capacity as u32)?) } else { None };
    let addr = nginx.as_ref().map_or(backend, |n| n.addr);

    let mut workers = Vec::with_capacity(sizes.processes);
    for index in 0..sizes.processes {
        let env = WorkerEnv {
            strategy: strategy.name,
            provider: addr,
            redis_url: redis.as_ref().map(RedisServer::url),
            callers: sizes.callers,
            limit: scenario.limit,
            lease: sizes.lease,
            poll_status: index == 0 && uses_redis,
            index,
            processes: sizes.processes,
            oracle_capacity: scenario.capacity,
            oracle_rate: scenario.rate_window(),
            tokens: scenario.announced.map_or(0, |a| a.tokens_per_job),
            keys: scenario.announced.map_or(1, |a| a.keys),
            rpm: scenario.announced.and_then(|a| a.configured_rpm).unwrap_or(0),
            bucket: scenario.bucket,
        };
        let proc = Proc::spawn("worker", &env.to_env(), index, tx.clone())?;
        let pid = proc.pid();
        workers.push(WorkerSlot { proc, pid, holding: BTreeSet::new(), ended: false, killed: false, finished: false });
    }
    drop(tx);
    let ready_by = Instant::now() + START_TIMEOUT;
    let mut ready = vec![false; workers.len()];
    while !ready.iter().all(|r| *r) {
        let left = ready_by.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(Message { from, line: Some(line) }) if from < ready.len() && line.starts_with("READY") => {
                ready[from] = true;
            }
            Ok(Message { from, line: None }) => return Err(format!("process {from} ended before it was ready")),
            Ok(_) => {}
            Err(_) => return Err(format!("the workers were not ready within {START_TIMEOUT:?}")),
        }
    }

    let mut redis_use = None;
    let mut admin = None;
    if let Some(server) = &redis {
        std::thread::sleep(HEARTBEAT_SETTLE);
        let status_cost = redis_stats::status_cost(&server.url(), scenario.limit)?;
        let mut con = server.connection().map_err(|e| e.to_string())?;
        redis::cmd("CONFIG").arg("RESETSTAT").exec(&mut con).map_err(|e| e.to_string())?;
        admin = Some(con);
        redis_use = Some(RedisUse { stats: CommandStats::default(), status_calls: 0, status_cost });
    }

    let service: Vec<(u64, u64)> =
        sizes.service_times().into_iter().enumerate().map(|(id, ms)| (id as u64, ms)).collect();
    let ideal = scenario.ideal_s(&service, sizes.jobs);
    let deadline_after = Duration::from_secs_f64((ideal * 10.0).max(120.0));
    let t0 = now_us();
    let started = Instant::now();
    for worker in &mut workers {
        worker.proc.send(&format!("GO t0={t0}"));
    }
    let mut result = RunResult::new(strategy.name, t0, sizes.jobs);
    let mut next_job = 0u64;
    let hand_out = |worker: &mut WorkerSlot, next_job: &mut u64| {
        if *next_job < sizes.jobs && !worker.killed && !worker.ended {
            worker.proc.send(&format!("JOB id={next_job}"));
            worker.holding.insert(*next_job);
            *next_job += 1;
        }
    };
    for _ in 0..sizes.callers {
        for worker in &mut workers {
            hand_out(worker, &mut next_job);
        }
    }
    let mut all_handed_out = false;
    let mut done = 0u64;
    let mut pre_kill_stats: Option<CommandStats> = None;
    let (mut redis_killed, mut redis_restarted, mut worker_killed) = (false, false, false);
    loop {
        if next_job == sizes.jobs && !all_handed_out {
            all_handed_out = true;
            for worker in &mut workers {
                worker.proc.send("END");
            }
        }
        if workers.iter().all(|w| w.finished || w.ended) {
            break;
        }
        if started.elapsed() > deadline_after {
            result.timed_out = true;
            eprintln!("  [{}] {}: deadline of {deadline_after:?} passed; stopping", scenario.name, strategy.name);
            break;
        }
        let message = match rx.recv_timeout(Duration::from_millis(50)) {
            Ok(message) => Some(message),
            Err(RecvTimeoutError::Timeout) => None,
            Err(RecvTimeoutError::Disconnected) => break,
        };
        if let Some(Message { from, line }) = message {
            if from == PROVIDER {
                if line.is_none() {
                    return Err("the provider died".into());
                }
                continue;
            }
            let worker = &mut workers[from];
            match line {
                None => {
                    worker.ended = true;
                    if !worker.finished {
                        result.lost.extend(worker.holding.iter().copied());
                        if !worker.killed {
                            eprintln!("  worker {} ended without finishing", worker.pid);
                        }
                    }
                }
                Some(line) if line.starts_with("DONE") => {
                    let Some(job) = JobDone::parse(&line) else { return Err(format!("bad line {line:?}")) };
                    worker.holding.remove(&job.id);
                    if let Some(slot) = result.jobs.get_mut(job.id as usize) {
                        *slot = Some(job);
                    }
                    done += 1;
                    hand_out(worker, &mut next_job);
                }
                Some(line) if line.starts_with("STATUS") => {
                    if let Some(sample) = StatusSample::parse(&line) {
                        result.status.push(sample);
                    }
                }
                Some(line) if line.starts_with("FINISHED") => {
                    worker.finished = true;
                    result.settled.0 += num::<u64>(&line, "settled_ok").unwrap_or(0);
                    result.settled.1 += num::<u64>(&line, "settled_bad").unwrap_or(0);
                    if let (Some(calls), Some(use_)) = (num::<u64>(&line, "status_calls"), redis_use.as_mut()) {
                        use_.status_calls += calls;
                    }
                }
                Some(_) => {}
            }
        }
        let progress = done as f64 / sizes.jobs as f64;
        match scenario.event {
            Event::Nothing => {}
            Event::RedisOutage { kill_at, restart_at } => {
                if !redis_killed && progress >= kill_at {
                    redis_killed = true;
                    if let (Some(server), Some(con)) = (redis.as_mut(), admin.as_mut()) {
                        pre_kill_stats = Some(CommandStats::read(con).map_err(|e| e.to_string())?);
                        server.kill().map_err(|e| format!("kill redis: {e}"))?;
                    }
                    result.marks.push((now_us(), Mark::RedisKilled));
                }
                if redis_killed && !redis_restarted && progress >= restart_at {
                    redis_restarted = true;
                    if let Some(server) = redis.as_mut() {
                        server.restart().map_err(|e| format!("restart redis: {e}"))?;
                        admin = Some(server.connection().map_err(|e| e.to_string())?);
                    }
                    result.marks.push((now_us(), Mark::RedisRestarted));
                }
            }
            Event::WorkerCrash { at } => {
                if !worker_killed && progress >= at {
                    worker_killed = true;
                    let victim = workers.last_mut().expect("at least two workers");
                    let _ = victim.proc.child.kill();
                    let killed_at = now_us();
                    victim.killed = true;
                    result.marks.push((killed_at, Mark::WorkerKilled));
                    let mut crash = Crash { pid: victim.pid, holding: victim.holding.len(), permits: None };
                    if let Some(con) = admin.as_mut() {
                        crash.permits = Some(killed_permits(con, victim.pid, killed_at)?);
                    }
                    result.crash = Some(crash);
                }
            }
        }
    }
    result.completed_in = started.elapsed();
    for worker in &mut workers {
        let _ = worker.proc.child.kill();
    }
    if let (Some(use_), Some(con)) = (redis_use.as_mut(), admin.as_mut()) {
        use_.stats = CommandStats::read(con).map_err(|e| e.to_string())?;
        if let Some(before) = &pre_kill_stats {
            use_.stats.add(before);
        }
    }
    result.redis = redis_use;
    (result.requests, result.bucket) = dump_requests(&mut provider, &rx, scenario, strategy)?;
    drop(workers);
    drop(nginx);
    drop(provider);
    drop(redis);
    result.wall = wall.elapsed();
    Ok(result)
}

/// The killed worker's permits still in the shared set: how many, and for how long (at most)
/// they keep capacity from the fleet (until their lease runs out).
fn killed_permits(con: &mut redis::Connection, pid: u32, killed_at: u64) -> Result<(usize, f64), String> {
    let name = UpstreamName::new(UPSTREAM).map_err(|e| e.to_string())?;
    let key = Keyspace::default().upstream(&name).permits;
    let members: Vec<(String, f64)> =
        redis::cmd("ZRANGE").arg(&key).arg(0).arg(-1).arg("WITHSCORES").query(con).map_err(|e| e.to_string())?;
    let prefix = format!("{pid}-");
    let theirs: Vec<f64> = members.into_iter().filter(|(id, _)| id.starts_with(&prefix)).map(|(_, s)| s).collect();
    let now_ms = killed_at as f64 / 1000.0;
    let blocked = theirs.iter().map(|expiry| (expiry - now_ms) / 1000.0).fold(0.0, f64::max);
    Ok((theirs.len(), blocked))
}

/// Asks the provider for its records and reads them (and what its bucket saw, if any).
fn dump_requests(
    provider: &mut Proc,
    rx: &Receiver<Message>,
    scenario: &Scenario,
    strategy: &Strategy,
) -> Result<(Vec<Request>, Option<BucketLog>), String> {
    let path = std::env::temp_dir().join(format!(
        "wavegate-scenarios-{}-{}-{}.txt",
        std::process::id(),
        scenario.name,
        strategy.name
    ));
    provider.send(&format!("DUMP path={}", path.display()));
    let line = wait_for(rx, PROVIDER, "DUMPED", Duration::from_secs(30), |_| {})?;
    let text = std::fs::read_to_string(&path).map_err(|e| format!("provider records ({line}): {e}"))?;
    let _ = std::fs::remove_file(&path);
    Ok((text.lines().filter_map(Request::parse).collect(), BucketLog::parse(&line)))
}
