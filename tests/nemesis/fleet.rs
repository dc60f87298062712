//! The machinery both nemesis runs share: worker processes (this binary run again) with their
//! mode timelines, the faults, the commands a worker answers after its load, and the check of
//! the calls at once at the provider against each moment's bound (docs/guarantees.md).

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rand::Rng;
use rand::rngs::SmallRng;
use wavegate::{Mode, Scheduler};
use wavegate_testkit::{Fault, FaultProxy, RedisServer};

/// The environment variable that makes this binary a worker (its value says which).
pub(crate) const ROLE: &str = "WAVEGATE_NEMESIS_ROLE";
/// A change of mode within this of a moment makes it a switching moment (at least; a run
/// with longer calls widens it by their length).
pub(crate) const SWITCH_WINDOW_MS: u64 = 300;

pub(crate) fn unix_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

/// One life of a worker process: its mode timeline, as it printed it.
#[derive(Debug, Default)]
pub(crate) struct Life {
    pub(crate) spawned_ms: u64,
    pub(crate) killed_ms: Option<u64>,
    /// (unix ms, mode, fallback share) at each change of mode.
    pub(crate) modes: Vec<(u64, Mode, usize)>,
}

impl Life {
    /// Whether its calls can be at the provider at `t`: from its start until the calls it had
    /// running when it was killed have ended there (`outlive_ms` later; the provider finishes
    /// them anyway).
    pub(crate) fn alive_at(&self, t: u64, outlive_ms: u64) -> bool {
        self.spawned_ms <= t && self.killed_ms.is_none_or(|k| t < k + outlive_ms)
    }

    /// The mode at `t` (shared before the first report: a process starts in shared mode).
    pub(crate) fn mode_at(&self, t: u64) -> (Mode, usize) {
        self.modes.iter().take_while(|(at, ..)| *at <= t).last().map_or((Mode::Shared, 0), |(_, m, s)| (*m, *s))
    }
}

/// A running worker; killed on drop.
pub(crate) struct Worker {
    pub(crate) child: Child,
    stdin: Option<ChildStdin>,
    lines: mpsc::Receiver<String>,
    pub(crate) life: Arc<Mutex<Life>>,
}

impl Worker {
    /// This binary again with `ROLE=role` and `envs`; its `MODE` lines feed its timeline.
    pub(crate) fn spawn(role: &str, envs: &[(&str, String)]) -> Worker {
        let mut command = Command::new(std::env::current_exe().expect("own path"));
        command.env(ROLE, role).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::inherit());
        for (key, value) in envs {
            command.env(key, value);
        }
        let spawned_ms = unix_ms();
        let mut child = command.spawn().expect("spawn worker");
        let life = Arc::new(Mutex::new(Life { spawned_ms, ..Life::default() }));
        let stdout = child.stdout.take().expect("piped stdout");
        let stdin = child.stdin.take();
        let (tx, lines) = mpsc::channel();
        let timeline = life.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Some(rest) = line.strip_prefix("MODE ") {
                    let parts: Vec<&str> = rest.split_whitespace().collect();
                    let mode = match parts.first() {
                        Some(&"fallback") => Mode::Fallback,
                        _ => Mode::Shared,
                    };
                    let at = parts.get(1).and_then(|v| v.parse().ok()).unwrap_or_else(unix_ms);
                    let share = parts.get(2).and_then(|v| v.parse().ok()).unwrap_or(0);
                    timeline.lock().expect("timeline").modes.push((at, mode, share));
                } else if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Worker { child, stdin, lines, life }
    }

    pub(crate) fn expect_line(&self, prefix: &str, timeout: Duration) -> String {
        crate::common::expect_line(&self.lines, self.child.id(), prefix, timeout)
    }

    pub(crate) fn send(&mut self, command: &str) {
        let stdin = self.stdin.as_mut().expect("worker stdin");
        writeln!(stdin, "{command}").and_then(|()| stdin.flush()).expect("write to worker");
    }

    pub(crate) fn mode(&self) -> Mode {
        self.life.lock().expect("timeline").mode_at(u64::MAX).0
    }

    /// kill -9; when.
    pub(crate) fn kill(&mut self) -> u64 {
        self.child.kill().expect("kill -9 worker");
        let killed = unix_ms();
        let _ = self.child.wait();
        self.life.lock().expect("timeline").killed_ms = Some(killed);
        killed
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        drop(self.stdin.take());
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FaultKind {
    RedisKillRestart,
    RedisStop,
    ClientPause,
    ScriptFlush,
    BlackHole,
    WorkerKill,
    FlushAll,
}

/// Applies a fault that the store or the network suffers (not [`FaultKind::WorkerKill`], which
/// the run does on its workers); returns what was done, for the log. Blocks while it lasts.
pub(crate) fn store_fault(
    kind: FaultKind,
    rng: &mut SmallRng,
    redis: &mut RedisServer,
    proxies: &[FaultProxy],
) -> String {
    match kind {
        FaultKind::RedisKillRestart => {
            redis.kill().expect("kill -9 redis");
            let down = rng.random_range(300..1_500);
            std::thread::sleep(Duration::from_millis(down));
            redis.restart().expect("restart redis, empty");
            format!("kill -9 redis, empty restart after {down} ms")
        }
        FaultKind::RedisStop => {
            let stopped = rng.random_range(1_000..3_000);
            redis.pause().expect("SIGSTOP");
            std::thread::sleep(Duration::from_millis(stopped));
            redis.resume().expect("SIGCONT");
            format!("SIGSTOP redis for {stopped} ms")
        }
        FaultKind::ClientPause => {
            let mut con = redis.connection().expect("connection");
            redis::cmd("CLIENT").arg("PAUSE").arg(2_000).arg("ALL").exec(&mut con).expect("CLIENT PAUSE");
            std::thread::sleep(Duration::from_millis(2_000));
            "CLIENT PAUSE 2000 ALL".to_string()
        }
        FaultKind::ScriptFlush => {
            redis.flush_scripts().expect("SCRIPT FLUSH");
            "SCRIPT FLUSH".to_string()
        }
        FaultKind::FlushAll => {
            let mut con = redis.connection().expect("connection");
            redis::cmd("FLUSHALL").exec(&mut con).expect("FLUSHALL");
            "FLUSHALL".to_string()
        }
        FaultKind::BlackHole => {
            let i = rng.random_range(0..proxies.len());
            proxies[i].set_fault(Fault::BlackHole);
            std::thread::sleep(Duration::from_millis(2_000));
            proxies[i].set_fault(Fault::None);
            format!("black hole between worker {i} and redis for 2 s")
        }
        FaultKind::WorkerKill => unreachable!("a worker's kill is the run's to do"),
    }
}

/// The most calls at once at the provider, by kind of moment, and the moments over their bound.
#[derive(Debug, Default)]
pub(crate) struct Peaks {
    pub(crate) shared: usize,
    pub(crate) fallback: usize,
    pub(crate) partial: usize,
    pub(crate) switching: usize,
    pub(crate) switches: usize,
    pub(crate) violations: Vec<String>,
    pub(crate) shares_over: Vec<String>,
}

/// Checks the provider's record (`spans`: begin and end in unix ms) against the timelines: with
/// every process in shared mode at most `limit`; with every process in fallback the sum of their
/// shares (which must be at most the limit); with some in fallback the limit plus their shares;
/// within `switch_ms` of a change of mode the limit plus the shares of every process in fallback
/// in that window. `notch` makes each bound one too strict. `outlive_ms`: how long a killed
/// worker's calls may still run at the provider.
pub(crate) fn concurrency(
    spans: &[(u64, u64)],
    lives: &[std::sync::MutexGuard<'_, Life>],
    limit: usize,
    notch: usize,
    start_ms: u64,
    switch_ms: u64,
    outlive_ms: u64,
) -> Peaks {
    let mut starts: Vec<u64> = spans.iter().map(|s| s.0).collect();
    let mut ends: Vec<u64> = spans.iter().map(|s| s.1).collect();
    starts.sort_unstable();
    ends.sort_unstable();
    let changes: Vec<u64> = lives.iter().flat_map(|l| l.modes.iter().skip(1).map(|m| m.0)).collect();
    let mut peaks = Peaks { switches: changes.len(), ..Peaks::default() };
    let mut j = 0;
    for (i, &t) in starts.iter().enumerate() {
        while j < ends.len() && ends[j] <= t {
            j += 1;
        }
        let in_flight = i + 1 - j;
        let live: Vec<&std::sync::MutexGuard<'_, Life>> = lives.iter().filter(|l| l.alive_at(t, outlive_ms)).collect();
        let modes: Vec<(Mode, usize)> = live.iter().map(|l| l.mode_at(t)).collect();
        let switching = changes.iter().any(|c| c.abs_diff(t) <= switch_ms);
        let fallback_shares: usize = modes.iter().filter(|m| m.0 == Mode::Fallback).map(|m| m.1).sum();
        let all_fallback = modes.iter().all(|m| m.0 == Mode::Fallback);
        let (kind, bound) = if switching {
            let window: usize = live
                .iter()
                .map(|l| {
                    l.modes
                        .iter()
                        .filter(|m| m.1 == Mode::Fallback && m.0 <= t + switch_ms)
                        .filter(|m| {
                            // in fallback at some moment of the window
                            let left = l.modes.iter().find(|n| n.0 > m.0).map_or(u64::MAX, |n| n.0);
                            left.saturating_add(switch_ms) >= t
                        })
                        .map(|m| m.2)
                        .max()
                        .unwrap_or(0)
                })
                .sum();
            peaks.switching = peaks.switching.max(in_flight);
            ("switching", limit + window - notch)
        } else if fallback_shares == 0 {
            peaks.shared = peaks.shared.max(in_flight);
            ("shared", limit - notch)
        } else if all_fallback {
            peaks.fallback = peaks.fallback.max(in_flight);
            if fallback_shares + notch * limit > limit {
                peaks
                    .shares_over
                    .push(format!("at +{} ms: shares sum to {fallback_shares}", t.saturating_sub(start_ms)));
            }
            ("fallback", fallback_shares - notch)
        } else {
            peaks.partial = peaks.partial.max(in_flight);
            ("partial", limit + fallback_shares - notch)
        };
        if in_flight > bound {
            peaks
                .violations
                .push(format!("{in_flight} at once ({kind}, bound {bound}) at +{} ms", t.saturating_sub(start_ms)));
        }
    }
    peaks
}

/// Answers the orchestrator's commands on stdin until it closes it: `hold` (one permit, kept),
/// `release`, `capacity N` (N permits at once, within 3 s).
pub(crate) async fn serve_commands(scheduler: Scheduler) {
    let mock = scheduler.upstream("mock").expect("configured");
    let (tx, mut commands) = tokio::sync::mpsc::unbounded_channel();
    std::thread::spawn(move || {
        for line in std::io::stdin().lock().lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut holding = None;
    while let Some(command) = commands.recv().await {
        let mut words = command.split_whitespace();
        match words.next() {
            Some("hold") => match tokio::time::timeout(Duration::from_secs(5), mock.request().acquire()).await {
                Ok(Ok(permit)) => {
                    println!("HOLDING {}", permit.id());
                    holding = Some(permit);
                }
                _ => println!("HOLDING none"),
            },
            Some("release") => {
                if let Some(permit) = holding.take() {
                    permit.succeeded();
                }
                println!("RELEASED");
            }
            Some("capacity") => {
                let n: usize = words.next().and_then(|n| n.parse().ok()).unwrap_or(1);
                let started = Instant::now();
                let asks = (0..n).map(|_| tokio::time::timeout(Duration::from_secs(3), mock.request().acquire()));
                let answers = futures_util::future::join_all(asks).await;
                let permits: Vec<_> = answers.into_iter().filter_map(|a| a.ok().and_then(Result::ok)).collect();
                println!("CAPACITY got={} in_ms={}", permits.len(), started.elapsed().as_millis());
                drop(permits);
            }
            _ => {}
        }
    }
}

/// Prints `MODE <mode> <unix ms> <fallback share>` at every change of the scheduler's mode.
pub(crate) fn report_mode_changes(scheduler: Scheduler) {
    actix::spawn(async move {
        let mut last = None;
        loop {
            let Ok(mode) = scheduler.mode().await else { return };
            if last != Some(mode) {
                let at = unix_ms();
                let share = match mode {
                    Mode::Fallback => {
                        scheduler.upstream("mock").expect("configured").status().await.map(|s| s.limit).unwrap_or(0)
                    }
                    _ => 0,
                };
                println!("MODE {mode} {at} {share}");
                last = Some(mode);
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    });
}
