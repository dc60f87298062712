//! Helpers shared by the whole-system tests (each test file that needs them says `mod common;`).
#![allow(dead_code)] // each test file uses only some of them

use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant, SystemTime};

use wavegate::{Mode, Outcome, Scheduler, TransportError};
use wavegate_testkit::http_get;

/// Waits (bounded by `within`) until `scheduler` is in `mode`; how long it took.
pub(crate) async fn wait_for_mode(scheduler: &Scheduler, mode: Mode, within: Duration) -> Duration {
    let started = Instant::now();
    loop {
        if scheduler.mode().await.expect("mode") == mode {
            return started.elapsed();
        }
        assert!(started.elapsed() < within, "not in {mode} mode within {within:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A worker process's setting from its environment (it cannot run without it).
pub(crate) fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("worker needs {name}"))
}

/// The first line starting with `prefix` that a worker process (`pid`) printed, within
/// `timeout`; the other lines are skipped.
pub(crate) fn expect_line(lines: &Receiver<String>, pid: u32, prefix: &str, timeout: Duration) -> String {
    let deadline = Instant::now() + timeout;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match lines.recv_timeout(left) {
            Ok(line) if line.starts_with(prefix) => return line,
            Ok(_) => {}
            Err(_) => panic!("no `{prefix}` line from worker {pid} within {timeout:?}"),
        }
    }
}

/// What a mock provider's answer means: its status, its headers and its body's error code (a
/// transport failure as a connect error).
pub(crate) fn classify(result: &Result<wavegate_testkit::HttpReply, std::io::Error>) -> Outcome {
    match result {
        Ok(reply) => {
            let headers = reply.headers.iter().map(|(name, value)| (name.as_str(), value.as_bytes()));
            let signals = wavegate::ProviderSignals::from_headers(headers, SystemTime::now());
            Outcome::from_signals(reply.status, wavegate_testkit::error_code(&reply.body), signals)
        }
        Err(_) => Outcome::from_transport(TransportError::Connect),
    }
}

/// One `GET /` to the mock upstream, its answer as the scheduler's closures return it.
pub(crate) async fn call_mock(mock: SocketAddr) -> Result<(), Outcome> {
    match http_get(mock, "/", Duration::from_secs(10)).await {
        Ok(reply) if reply.status == 200 => Ok(()),
        Ok(reply) => Err(Outcome::from_status(reply.status, reply.retry_after.as_deref(), SystemTime::now())),
        Err(_) => Err(Outcome::from_transport(TransportError::Connect)),
    }
}

/// A worker's load: `callers` tasks calling the mock through `upstream` until `until`; the
/// calls that succeeded, those that failed, and the first failure's words.
pub(crate) async fn call_until(
    upstream: &wavegate::Upstream,
    mock: SocketAddr,
    callers: usize,
    until: std::time::Instant,
) -> (u64, u64, Option<String>) {
    call_while(upstream, mock, callers, move |_, _| std::time::Instant::now() < until).await
}

/// A worker's load: `callers` tasks calling the mock through `upstream`, each as long as
/// `go_on(caller, calls it made)` says; the calls that succeeded, those that failed, and the
/// first failure's words.
pub(crate) async fn call_while(
    upstream: &wavegate::Upstream,
    mock: SocketAddr,
    callers: usize,
    go_on: impl Fn(usize, u64) -> bool + Clone + 'static,
) -> (u64, u64, Option<String>) {
    let tasks: Vec<_> = (0..callers)
        .map(|caller| {
            let (upstream, go_on) = (upstream.clone(), go_on.clone());
            actix::spawn(async move {
                let (mut ok, mut err, mut first_error) = (0u64, 0u64, None);
                while go_on(caller, ok + err) {
                    match upstream.request().call(move |_| call_mock(mock)).await {
                        Ok(()) => ok += 1,
                        Err(error) => {
                            err += 1;
                            first_error.get_or_insert(error.to_string());
                        }
                    }
                }
                (ok, err, first_error)
            })
        })
        .collect();
    let (mut ok, mut err, mut first_error) = (0, 0, None);
    for task in tasks {
        let (o, e, f) = task.await.expect("caller task");
        ok += o;
        err += e;
        first_error = first_error.or(f);
    }
    (ok, err, first_error)
}

/// Runs the named scenarios of a `harness = false` test (those whose name contains one of the
/// command line's words, or all), each caught on its own; prints libtest-like lines and exits
/// with 1 if one failed.
pub(crate) fn run_scenarios(scenarios: &[(&str, fn())]) {
    let filter: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with('-')).collect();
    let (mut passed, mut failed) = (0, 0);
    for &(name, scenario) in scenarios {
        if !filter.is_empty() && !filter.iter().any(|f| name.contains(f.as_str())) {
            continue;
        }
        let started = Instant::now();
        match std::panic::catch_unwind(scenario) {
            Ok(()) => {
                passed += 1;
                println!("test {name} ... ok ({:.1} s)", started.elapsed().as_secs_f64());
            }
            Err(_) => {
                failed += 1;
                println!("test {name} ... FAILED");
            }
        }
    }
    println!("{passed} passed, {failed} failed");
    if failed > 0 {
        std::process::exit(1);
    }
}

/// The number after `name=` in a worker's `key=value` line.
pub(crate) fn field(line: &str, name: &str) -> u64 {
    line.split_whitespace()
        .find_map(|kv| kv.strip_prefix(&format!("{name}=")))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {name}= in {line:?}"))
}

/// A worker process: this test binary run again with `role_var=worker`, its stdout read line by
/// line on a thread; killed on drop if still running.
pub(crate) struct Worker {
    pub(crate) child: Child,
    lines: Receiver<String>,
}

impl Worker {
    /// Starts a worker with `envs`, its stdin piped (see [`tell`](Self::tell)).
    pub(crate) fn spawn(role_var: &str, envs: &[(&str, String)]) -> Worker {
        let mut command = Command::new(std::env::current_exe().expect("own path"));
        command.env(role_var, "worker").stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::inherit());
        for (key, value) in envs {
            command.env(key, value);
        }
        let mut child = command.spawn().expect("spawn worker");
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Worker { child, lines }
    }

    /// The first line starting with `prefix`, within `timeout`.
    pub(crate) fn expect_line(&self, prefix: &str, timeout: Duration) -> String {
        expect_line(&self.lines, self.child.id(), prefix, timeout)
    }

    /// Sends the worker a line on its stdin.
    pub(crate) fn tell(&mut self, line: &str) {
        let stdin = self.child.stdin.as_mut().expect("piped stdin");
        writeln!(stdin, "{line}").and_then(|()| stdin.flush()).expect("write to the worker");
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A scheduler builder in a namespace of its own: local schedulers of one process that name an
/// upstream alike share its limit (as they would through Redis), and the tests of one binary
/// run in one process, in parallel. Each test that builds its own local scheduler starts here.
pub(crate) fn isolated() -> wavegate::SchedulerBuilder {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    Scheduler::builder().key_prefix(format!("test-{}-{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed)))
}

/// One call of `request` to the mock provider at `addr`, given up (its future dropped) after
/// `patience`, as an HTTP handler is cancelled when its client hangs up; whether it was.
pub(crate) async fn call_given_up(request: wavegate::RequestBuilder<'_>, addr: SocketAddr, patience: Duration) -> bool {
    let call = request.call(|_| async move {
        http_get(addr, "/", Duration::from_secs(2))
            .await
            .map(|_| ())
            .map_err(|_| Outcome::from_transport(TransportError::Reset))
    });
    tokio::time::timeout(patience, call).await.is_err()
}

/// The seed of a randomized test: `$var` if set (to replay a run), else a fresh one; printed
/// either way, so a failure can be replayed.
pub(crate) fn seed(var: &str) -> u64 {
    use rand::Rng;
    let seed =
        std::env::var(var).ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| rand::rng().random::<u64>() % 1_000_000);
    println!("{var}={seed}");
    seed
}

/// The script calls (`EVALSHA`, `EVAL`) the Redis server behind `con` has run since its
/// statistics were last reset (`INFO commandstats`).
pub(crate) fn script_calls(con: &mut redis::Connection) -> u64 {
    let stats: String = redis::cmd("INFO").arg("commandstats").query(con).expect("INFO");
    stats
        .lines()
        .filter(|l| l.starts_with("cmdstat_evalsha") || l.starts_with("cmdstat_eval:"))
        .filter_map(|l| l.split("calls=").nth(1)?.split(',').next()?.parse::<u64>().ok())
        .sum()
}

/// The key of `upstream`'s wave state in the store behind `redis`, in the default keyspace
/// (the provider's windows are fields of it).
#[cfg(feature = "redis")]
pub(crate) fn wave_key(redis: &wavegate_testkit::RedisServer, upstream: &str) -> String {
    let name = wavegate::config::UpstreamName::new(upstream).expect("name");
    wavegate::StoreConfig::new(redis.url()).keyspace.upstream(&name).wave
}
