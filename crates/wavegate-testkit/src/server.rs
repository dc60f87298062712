//! A real `redis-server` process that a test owns and can break.

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use tempfile::TempDir;

use crate::HarnessError;
use crate::builder::{RedisServerBuilder, ServerConfig};
use crate::log::LogFiles;
use crate::port::PortReservation;
use crate::process::{kill_and_reap, send_signal, wait_exit, wait_stopped_state};

/// How many fresh ports [`RedisServer::start`] tries when the chosen one
/// turns out to be taken.
const START_ATTEMPTS: usize = 5;
/// How long [`RedisServer::restart`] keeps retrying while its port is taken.
const RESTART_BIND_TIMEOUT: Duration = Duration::from_secs(5);
/// Pause between two launches on a taken port.
const BIND_RETRY_PAUSE: Duration = Duration::from_millis(100);
/// Bound on reaping the process after SIGKILL.
const KILL_TIMEOUT: Duration = Duration::from_secs(5);
/// Bound on a graceful exit after SIGTERM, before escalating to SIGKILL.
const STOP_TIMEOUT: Duration = Duration::from_secs(5);
/// Bound on observing the stopped/continued state after SIGSTOP/SIGCONT.
const SIGNAL_STATE_TIMEOUT: Duration = Duration::from_secs(2);
/// Pause between two readiness probes.
const PROBE_INTERVAL: Duration = Duration::from_millis(10);
/// Connect bound of a readiness probe.
const PROBE_CONNECT_TIMEOUT: Duration = Duration::from_millis(250);
/// Read/write bound of a readiness probe.
const PROBE_IO_TIMEOUT: Duration = Duration::from_millis(500);
/// Connect and read/write bound of [`RedisServer::connection`].
const CONNECTION_TIMEOUT: Duration = Duration::from_secs(2);

/// A `redis-server` process on 127.0.0.1, owned by a test.
///
/// The server listens on a free port, runs in its own temporary directory
/// with persistence off (`--save ""`, `--appendonly no`) and logs to a file
/// there. A test can [`kill`](Self::kill) it (SIGKILL), [`stop`](Self::stop)
/// it gracefully, [`pause`](Self::pause) and [`resume`](Self::resume) it
/// (SIGSTOP/SIGCONT), and [`restart`](Self::restart) it on the same port with
/// an empty dataset.
///
/// Dropping the server SIGKILLs the process (even if paused), reaps it and
/// removes the temporary directory. If the test process itself is killed
/// (not unwound), the server outlives it.
///
/// Every wait is bounded: startup (10 s by default), reaping after SIGKILL
/// (5 s), graceful stop (5 s, then SIGKILL), restart on a taken port (5 s).
#[derive(Debug)]
pub struct RedisServer {
    config: ServerConfig,
    port: PortReservation,
    child: Option<Child>,
    paused: bool,
    last_exit: Option<ExitStatus>,
    logs: LogFiles,
    dir: TempDir,
}

impl RedisServer {
    /// Starts `redis-server` on a free port and waits until it answers.
    ///
    /// The binary is `$WAVEGATE_REDIS_SERVER` if that is set and non-empty,
    /// else `redis-server` from `PATH`. Use [`RedisServer::builder`] to choose
    /// a binary or pass extra arguments.
    ///
    /// # Errors
    ///
    /// - [`HarnessError::BinaryNotFound`] if the binary does not exist; the
    ///   message says how to install it or point the harness at it.
    /// - [`HarnessError::Exited`] or [`HarnessError::StartTimeout`] if the
    ///   server died or did not answer `PING` in time; both carry the tail of
    ///   the server's log.
    /// - [`HarnessError::Spawn`] or [`HarnessError::Io`] for other failures.
    pub fn start() -> Result<Self, HarnessError> {
        Self::builder().start()
    }

    /// A builder to choose the binary, extra arguments or startup timeout.
    pub fn builder() -> RedisServerBuilder {
        RedisServerBuilder::default()
    }

    pub(crate) fn start_with(config: ServerConfig) -> Result<Self, HarnessError> {
        let dir = tempfile::Builder::new().prefix("wavegate-redis-").tempdir()?;
        let logs = LogFiles::in_dir(dir.path());
        let mut attempt = 1;
        loop {
            let port = PortReservation::pick()?;
            match launch(&config, dir.path(), &logs, port.port()) {
                Ok(child) => {
                    return Ok(Self { config, port, child: Some(child), paused: false, last_exit: None, logs, dir });
                }
                Err(failure) if failure.port_in_use && attempt < START_ATTEMPTS => attempt += 1,
                Err(failure) => return Err(failure.error),
            }
        }
    }

    /// The TCP port the server listens on (unchanged across restarts).
    pub fn port(&self) -> u16 {
        self.port.port()
    }

    /// The server's address, `127.0.0.1:{port}`.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::LOCALHOST, self.port()))
    }

    /// The server's URL, `redis://127.0.0.1:{port}/`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port())
    }

    /// The process id, or `None` after [`kill`](Self::kill) or
    /// [`stop`](Self::stop) (or once [`is_running`](Self::is_running) noticed
    /// that the process died by itself).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// The server's temporary directory (its working dir and log files);
    /// removed when the server is dropped.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Redis's log file (inside [`dir`](Self::dir)); restarts append to it.
    pub fn log_path(&self) -> &Path {
        self.logs.redis_log()
    }

    /// A client for [`url`](Self::url). Connecting is up to the caller.
    ///
    /// # Panics
    ///
    /// Never in practice: the URL is always well formed.
    pub fn client(&self) -> redis::Client {
        redis::Client::open(self.url()).expect("a redis://127.0.0.1:PORT/ URL is always valid")
    }

    /// A synchronous connection with 2-second connect, read and write
    /// timeouts, so it cannot hang on a paused server.
    ///
    /// # Errors
    ///
    /// Fails if the server does not accept the connection in time.
    pub fn connection(&self) -> Result<redis::Connection, HarnessError> {
        let con = self.client().get_connection_with_timeout(CONNECTION_TIMEOUT)?;
        con.set_read_timeout(Some(CONNECTION_TIMEOUT))?;
        con.set_write_timeout(Some(CONNECTION_TIMEOUT))?;
        Ok(con)
    }

    /// Whether the process is alive (a paused process counts as running).
    ///
    /// If the process died by itself, this reaps it, records its exit status
    /// (see [`last_exit_status`](Self::last_exit_status)) and returns `false`.
    pub fn is_running(&mut self) -> bool {
        let Some(child) = self.child.as_mut() else {
            return false;
        };
        match child.try_wait() {
            Ok(None) => true,
            Ok(Some(status)) => {
                self.reaped(status);
                false
            }
            // Cannot happen for a child we own and have not reaped; treat
            // it as alive so that drop still tries to kill it.
            Err(_) => true,
        }
    }

    /// Whether the server is paused by [`pause`](Self::pause).
    pub fn is_paused(&self) -> bool {
        self.paused
    }

    /// How the last server process ended, once it was killed, stopped or
    /// found dead; `None` while the first process runs.
    pub fn last_exit_status(&self) -> Option<ExitStatus> {
        self.last_exit
    }

    /// Kills the server like `kill -9` (works on a paused server too) and
    /// reaps it. Clients see their connections reset; new connections are
    /// refused. Does nothing if the server is not running.
    ///
    /// # Errors
    ///
    /// Fails if the process cannot be signalled or is not reaped within 5 s.
    pub fn kill(&mut self) -> Result<(), HarnessError> {
        if let Some(child) = self.child.as_mut() {
            let status = kill_and_reap(child, KILL_TIMEOUT)?;
            self.reaped(status);
        }
        Ok(())
    }

    /// Stops the server gracefully: SIGTERM (after SIGCONT if paused), which
    /// Redis answers by closing its clients and exiting 0 (no save, since
    /// persistence is off). If it has not exited within 5 s it is SIGKILLed;
    /// [`last_exit_status`](Self::last_exit_status) tells which happened.
    /// Does nothing if the server is not running.
    ///
    /// # Errors
    ///
    /// Fails if the process cannot be signalled or reaped.
    pub fn stop(&mut self) -> Result<(), HarnessError> {
        if !self.is_running() {
            return Ok(());
        }
        let Some(child) = self.child.as_mut() else {
            return Ok(());
        };
        let pid = child.id();
        if self.paused {
            send_signal(pid, Signal::SIGCONT)?;
        }
        send_signal(pid, Signal::SIGTERM)?;
        let status = match wait_exit(child, STOP_TIMEOUT, "exit after SIGTERM") {
            Ok(status) => status,
            Err(HarnessError::Timeout { .. }) => kill_and_reap(child, KILL_TIMEOUT)?,
            Err(err) => return Err(err),
        };
        self.reaped(status);
        Ok(())
    }

    /// Starts the server again on the same port, with an empty dataset and
    /// an empty script cache. A running (or paused) server is killed first.
    ///
    /// While the port is still taken (e.g. by a process that grabbed it in
    /// the meantime) this retries for up to 5 s.
    ///
    /// # Errors
    ///
    /// As for [`RedisServer::start`]; a port that stays taken ends in
    /// [`HarnessError::Exited`] with the bind error in the log tail.
    pub fn restart(&mut self) -> Result<(), HarnessError> {
        self.kill()?;
        let deadline = Instant::now() + RESTART_BIND_TIMEOUT;
        loop {
            match launch(&self.config, self.dir.path(), &self.logs, self.port()) {
                Ok(child) => {
                    self.child = Some(child);
                    return Ok(());
                }
                Err(failure) if failure.port_in_use && Instant::now() < deadline => {
                    thread::sleep(BIND_RETRY_PAUSE);
                }
                Err(failure) => return Err(failure.error),
            }
        }
    }

    /// Freezes the server with SIGSTOP: connections stay open and new ones
    /// are accepted by the kernel, but nothing is answered, so clients hit
    /// their timeouts. Returns once the process is observed stopped.
    ///
    /// # Errors
    ///
    /// [`HarnessError::NotRunning`] if the server is not running; signal or
    /// timeout errors otherwise.
    pub fn pause(&mut self) -> Result<(), HarnessError> {
        let pid = self.running_pid()?;
        send_signal(pid, Signal::SIGSTOP)?;
        self.paused = true;
        wait_stopped_state(pid, true, SIGNAL_STATE_TIMEOUT)
    }

    /// Thaws a paused server with SIGCONT; it then answers what queued up.
    /// Harmless on a server that is not paused.
    ///
    /// # Errors
    ///
    /// [`HarnessError::NotRunning`] if the server is not running; signal or
    /// timeout errors otherwise.
    pub fn resume(&mut self) -> Result<(), HarnessError> {
        let pid = self.running_pid()?;
        send_signal(pid, Signal::SIGCONT)?;
        self.paused = false;
        wait_stopped_state(pid, false, SIGNAL_STATE_TIMEOUT)
    }

    /// Empties the server's Lua script cache (`SCRIPT FLUSH`), as happens
    /// after a Redis restart or failover: `EVALSHA` then fails with
    /// `NOSCRIPT` until the script is loaded again.
    ///
    /// # Errors
    ///
    /// Fails if the server is not reachable within 2 s (e.g. paused).
    pub fn flush_scripts(&self) -> Result<(), HarnessError> {
        let mut con = self.connection()?;
        redis::cmd("SCRIPT").arg("FLUSH").exec(&mut con)?;
        Ok(())
    }

    fn running_pid(&mut self) -> Result<u32, HarnessError> {
        if !self.is_running() {
            return Err(HarnessError::NotRunning);
        }
        self.pid().ok_or(HarnessError::NotRunning)
    }

    /// Forgets the reaped child.
    fn reaped(&mut self, status: ExitStatus) {
        self.child = None;
        self.paused = false;
        self.last_exit = Some(status);
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        if let Some(child) = self.child.as_mut() {
            // Best effort: a drop must not panic or hang.
            let _ = kill_and_reap(child, KILL_TIMEOUT);
        }
        // Then the port reservation is released and the temp dir removed.
    }
}

/// Why a launch failed, and whether another port (or a later retry on the
/// same port) might succeed.
struct LaunchFailure {
    error: HarnessError,
    port_in_use: bool,
}

impl From<HarnessError> for LaunchFailure {
    fn from(error: HarnessError) -> Self {
        Self { error, port_in_use: false }
    }
}

/// Spawns one server process on `port` and waits until it answers.
fn launch(config: &ServerConfig, dir: &Path, logs: &LogFiles, port: u16) -> Result<Child, LaunchFailure> {
    let mark = logs.mark();
    let stdout = logs.open_stdio().map_err(HarnessError::from)?;
    let stderr = stdout.try_clone().map_err(HarnessError::from)?;
    let mut child = Command::new(&config.binary)
        .arg("--port")
        .arg(port.to_string())
        .args(["--bind", "127.0.0.1"])
        .args(["--save", ""])
        .args(["--appendonly", "no"])
        .args(["--daemonize", "no"])
        .arg("--dir")
        .arg(dir)
        .arg("--logfile")
        .arg(logs.redis_log())
        .args(&config.extra_args)
        .stdin(Stdio::null())
        .stdout(stdout)
        .stderr(stderr)
        .spawn()
        .map_err(|source| match source.kind() {
            std::io::ErrorKind::NotFound => HarnessError::BinaryNotFound { binary: config.binary.clone() },
            _ => HarnessError::Spawn { binary: config.binary.clone(), source },
        })?;

    let deadline = Instant::now() + config.startup_timeout;
    loop {
        let status = match child.try_wait() {
            Ok(status) => status,
            Err(err) => {
                let _ = kill_and_reap(&mut child, KILL_TIMEOUT);
                return Err(HarnessError::from(err).into());
            }
        };
        if let Some(status) = status {
            let text = logs.since(mark);
            return Err(LaunchFailure {
                port_in_use: text.port_in_use(),
                error: HarnessError::Exited { port, status, log_tail: text.tail() },
            });
        }
        // Only our own process counts: if the port was taken by another
        // server, that one answers while ours is about to exit.
        if probe_pid(port) == Some(child.id()) {
            return Ok(child);
        }
        if Instant::now() >= deadline {
            let _ = kill_and_reap(&mut child, KILL_TIMEOUT);
            return Err(HarnessError::StartTimeout {
                port,
                timeout: config.startup_timeout,
                log_tail: logs.since(mark).tail(),
            }
            .into());
        }
        thread::sleep(PROBE_INTERVAL);
    }
}

/// The `process_id` reported by the server on `port`, if one answers.
fn probe_pid(port: u16) -> Option<u32> {
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}/")).ok()?;
    let mut con = client.get_connection_with_timeout(PROBE_CONNECT_TIMEOUT).ok()?;
    con.set_read_timeout(Some(PROBE_IO_TIMEOUT)).ok()?;
    con.set_write_timeout(Some(PROBE_IO_TIMEOUT)).ok()?;
    let info: String = redis::cmd("INFO").arg("server").query(&mut con).ok()?;
    info.lines().find_map(|line| line.strip_prefix("process_id:")).and_then(|pid| pid.trim().parse().ok())
}
