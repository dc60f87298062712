//! Starting, stopping, restarting and dropping real `redis-server` processes.

use std::net::{Ipv4Addr, TcpListener};
use std::os::unix::process::ExitStatusExt;
use std::time::Duration;

use nix::errno::Errno;
use nix::sys::signal;
use nix::unistd::Pid;
use wavegate_testkit::{HarnessError, RedisServer};

/// Whether a process with this pid exists (zombies included).
fn pid_exists(pid: u32) -> bool {
    match signal::kill(Pid::from_raw(i32::try_from(pid).unwrap()), None) {
        Ok(()) => true,
        Err(Errno::ESRCH) => false,
        Err(err) => panic!("kill({pid}, 0) failed unexpectedly: {err}"),
    }
}

fn config_get(con: &mut redis::Connection, name: &str) -> String {
    let pair: (String, String) = redis::cmd("CONFIG").arg("GET").arg(name).query(con).unwrap();
    assert_eq!(pair.0, name);
    pair.1
}

fn server_pid(con: &mut redis::Connection) -> u32 {
    let info: String = redis::cmd("INFO").arg("server").query(con).unwrap();
    info.lines().find_map(|line| line.strip_prefix("process_id:")).unwrap().trim().parse().unwrap()
}

#[test]
fn start_serves_set_get_with_persistence_off() {
    let server = RedisServer::start().unwrap();
    let port = server.port();
    assert_ne!(port, 0);
    assert_eq!(server.url(), format!("redis://127.0.0.1:{port}/"));
    assert_eq!(server.addr().to_string(), format!("127.0.0.1:{port}"));

    let mut con = server.client().get_connection().unwrap();
    redis::cmd("SET").arg("greeting").arg("hello").exec(&mut con).unwrap();
    let value: String = redis::cmd("GET").arg("greeting").query(&mut con).unwrap();
    assert_eq!(value, "hello");

    // It is our process, configured as promised.
    assert_eq!(Some(server_pid(&mut con)), server.pid());
    assert_eq!(config_get(&mut con, "save"), "");
    assert_eq!(config_get(&mut con, "appendonly"), "no");
    assert_eq!(config_get(&mut con, "bind"), "127.0.0.1");
    let dir = std::fs::canonicalize(server.dir()).unwrap();
    assert_eq!(config_get(&mut con, "dir"), dir.to_str().unwrap());
    let log = std::fs::read_to_string(server.log_path()).unwrap();
    assert!(log.contains("Ready to accept connections"), "{log}");
}

#[test]
fn concurrent_starts_get_distinct_ports_and_processes() {
    let servers: Vec<RedisServer> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..3).map(|_| scope.spawn(|| RedisServer::start().unwrap())).collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let mut ports: Vec<u16> = servers.iter().map(RedisServer::port).collect();
    ports.sort_unstable();
    ports.dedup();
    assert_eq!(ports.len(), servers.len(), "ports {ports:?}");

    for (i, server) in servers.iter().enumerate() {
        let mut con = server.connection().unwrap();
        redis::cmd("SET").arg("who").arg(i).exec(&mut con).unwrap();
        assert_eq!(Some(server_pid(&mut con)), server.pid());
    }
    for (i, server) in servers.iter().enumerate() {
        let mut con = server.connection().unwrap();
        let who: usize = redis::cmd("GET").arg("who").query(&mut con).unwrap();
        assert_eq!(who, i, "servers share data");
    }
}

#[test]
fn builder_passes_extra_args() {
    let server = RedisServer::builder().extra_arg("--maxmemory").extra_arg("10mb").start().unwrap();
    let mut con = server.connection().unwrap();
    assert_eq!(config_get(&mut con, "maxmemory"), (10 * 1024 * 1024).to_string());
}

#[test]
fn bad_config_fails_fast_with_log_tail() {
    let started = std::time::Instant::now();
    let err = RedisServer::builder().extra_arg("--no-such-directive-xyz").extra_arg("1").start().unwrap_err();
    let message = err.to_string();
    assert!(matches!(err, HarnessError::Exited { .. }), "{message}");
    assert!(message.contains("no-such-directive-xyz"), "{message}");
    assert!(started.elapsed() < Duration::from_secs(5), "{:?}", started.elapsed());
}

#[test]
fn missing_binary_error_says_what_to_do() {
    let err = RedisServer::builder().binary("/nonexistent/redis-server-xyz").start().unwrap_err();
    let message = err.to_string();
    assert!(
        matches!(&err, HarnessError::BinaryNotFound { binary } if binary.to_str() == Some("/nonexistent/redis-server-xyz")),
        "{err:?}"
    );
    assert!(message.contains("`/nonexistent/redis-server-xyz`"), "{message}");
    assert!(message.contains("apt-get install redis-server"), "{message}");
    assert!(message.contains("WAVEGATE_REDIS_SERVER"), "{message}");
}

#[test]
fn drop_kills_process_frees_port_and_removes_dir() {
    let server = RedisServer::start().unwrap();
    let (pid, port, dir) = (server.pid().unwrap(), server.port(), server.dir().to_path_buf());
    assert!(pid_exists(pid));
    assert!(dir.is_dir());
    assert!(TcpListener::bind((Ipv4Addr::LOCALHOST, port)).is_err(), "port not in use");

    drop(server);

    assert!(!pid_exists(pid), "pid {pid} still exists (or is an unreaped zombie)");
    TcpListener::bind((Ipv4Addr::LOCALHOST, port)).expect("port is free after drop");
    assert!(!dir.exists(), "{} still exists", dir.display());
}

#[test]
fn drop_kills_a_paused_server() {
    let mut server = RedisServer::start().unwrap();
    let (pid, port) = (server.pid().unwrap(), server.port());
    server.pause().unwrap();
    assert!(server.is_paused());

    drop(server);

    assert!(!pid_exists(pid), "paused pid {pid} survived drop");
    TcpListener::bind((Ipv4Addr::LOCALHOST, port)).expect("port is free after drop");
}

#[test]
fn graceful_stop_then_restart() {
    let mut server = RedisServer::start().unwrap();
    let port = server.port();
    let pid = server.pid().unwrap();
    let mut con = server.connection().unwrap();
    redis::cmd("SET").arg("k").arg("v").exec(&mut con).unwrap();
    assert!(server.last_exit_status().is_none());

    server.stop().unwrap();
    let status = server.last_exit_status().unwrap();
    assert!(status.success(), "graceful stop should exit 0, got {status}");
    assert!(!server.is_running());
    assert_eq!(server.pid(), None);
    assert!(!pid_exists(pid));
    assert!(redis::cmd("PING").exec(&mut con).is_err());
    let err = server.client().get_connection().err().expect("connected to a stopped server");
    assert!(err.is_connection_refusal(), "{err:?}");
    assert!(matches!(server.pause(), Err(HarnessError::NotRunning)));
    server.stop().unwrap(); // no-op when already stopped

    server.restart().unwrap();
    assert!(server.is_running());
    assert_eq!(server.port(), port);
    assert_ne!(server.pid(), Some(pid));
    let mut con = server.connection().unwrap();
    let value: Option<String> = redis::cmd("GET").arg("k").query(&mut con).unwrap();
    assert_eq!(value, None, "data survived a restart with persistence off");

    // A paused server still stops gracefully (SIGCONT, then SIGTERM).
    server.pause().unwrap();
    server.stop().unwrap();
    let status = server.last_exit_status().unwrap();
    assert!(status.success(), "stop of a paused server: {status}");
    assert!(!server.is_paused());
}

#[test]
fn restart_of_a_running_server_replaces_the_process() {
    let mut server = RedisServer::start().unwrap();
    let old = server.pid().unwrap();
    server.restart().unwrap();
    let new = server.pid().unwrap();
    assert_ne!(old, new);
    assert!(!pid_exists(old));
    assert_eq!(server.last_exit_status().unwrap().signal(), Some(9));
    let mut con = server.connection().unwrap();
    assert_eq!(server_pid(&mut con), new);
}

#[test]
fn is_running_notices_a_crash_from_outside() {
    let mut server = RedisServer::start().unwrap();
    let pid = server.pid().unwrap();
    signal::kill(Pid::from_raw(i32::try_from(pid).unwrap()), signal::Signal::SIGKILL).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while server.is_running() {
        assert!(std::time::Instant::now() < deadline, "crash not noticed");
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(server.pid(), None);
    assert_eq!(server.last_exit_status().unwrap().signal(), Some(9));
    assert!(!pid_exists(pid), "crashed server was not reaped");
    server.restart().unwrap();
    server.connection().unwrap();
}

#[test]
fn startup_timeout_is_bounded_and_kills_the_process() {
    let scratch = tempfile::tempdir().unwrap();
    let pid_file = scratch.path().join("pid");
    let script = scratch.path().join("silent-redis-server");
    // Accepts any arguments, never listens: startup must give up and kill it.
    std::fs::write(&script, format!("#!/bin/sh\necho $$ > '{}'\nexec sleep 30\n", pid_file.display())).unwrap();
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();

    let started = std::time::Instant::now();
    let err = RedisServer::builder().binary(&script).startup_timeout(Duration::from_millis(300)).start().unwrap_err();
    let elapsed = started.elapsed();

    assert!(matches!(err, HarnessError::StartTimeout { .. }), "{err}");
    assert!(elapsed >= Duration::from_millis(300) && elapsed < Duration::from_secs(3), "{elapsed:?}");
    let pid: u32 = std::fs::read_to_string(&pid_file).unwrap().trim().parse().unwrap();
    assert!(!pid_exists(pid), "timed-out server {pid} was not killed and reaped");
}

#[test]
fn restart_waits_while_the_port_is_taken() {
    let mut server = RedisServer::start().unwrap();
    let port = server.port();
    server.kill().unwrap();
    // Someone else grabs the port for a while.
    let squatter = TcpListener::bind((Ipv4Addr::LOCALHOST, port)).unwrap();
    let release = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        drop(squatter);
    });

    let started = std::time::Instant::now();
    server.restart().unwrap();
    let elapsed = started.elapsed();
    release.join().unwrap();

    assert!(elapsed >= Duration::from_millis(300), "restart did not wait for the port: {elapsed:?}");
    assert!(elapsed < Duration::from_secs(5), "{elapsed:?}");
    assert_eq!(server.port(), port);
    let mut con = server.connection().unwrap();
    assert_eq!(server_pid(&mut con), server.pid().unwrap());
}

#[tokio::test]
async fn mock_upstream_counts_concurrency_and_answers_429_beyond_capacity() {
    use wavegate_testkit::{MockUpstream, MockUpstreamConfig, http_get};
    let mock = MockUpstream::start(MockUpstreamConfig {
        capacity: Some(3),
        service_time: Duration::from_millis(100),
        retry_after: "2".into(),

        ..Default::default()
    })
    .unwrap();
    let mut calls = tokio::task::JoinSet::new();
    for _ in 0..5 {
        let addr = mock.addr();
        calls.spawn(async move { http_get(addr, "/", Duration::from_secs(2)).await.unwrap() });
    }
    let replies = calls.join_all().await;
    let ok = replies.iter().filter(|r| r.status == 200).count();
    let limited: Vec<_> = replies.iter().filter(|r| r.status == 429).collect();
    assert_eq!((ok, limited.len()), (3, 2));
    assert!(limited.iter().all(|r| r.retry_after.as_deref() == Some("2")));
    assert_eq!((mock.served(), mock.rate_limited()), (3, 2));
    assert!(mock.max_in_flight() >= 4, "5 concurrent calls must overlap: {}", mock.max_in_flight());
    assert_eq!(mock.in_flight(), 0);
}
