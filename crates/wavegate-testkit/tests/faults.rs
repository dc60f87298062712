//! Breaking a real Redis under live clients: kill -9, SIGSTOP, script flush.

use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::sys::signal;
use nix::unistd::Pid;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{AsyncConnectionConfig, ErrorKind, ServerErrorKind};
use wavegate_testkit::RedisServer;

/// Bound on any single await in these tests, so a broken harness fails
/// instead of hanging.
const AWAIT_BOUND: Duration = Duration::from_secs(5);

async fn bounded<F: Future>(what: &str, fut: F) -> F::Output {
    tokio::time::timeout(AWAIT_BOUND, fut)
        .await
        .unwrap_or_else(|_| panic!("{what} did not finish within {AWAIT_BOUND:?}"))
}

async fn ping(con: &mut ConnectionManager) -> redis::RedisResult<String> {
    redis::cmd("PING").query_async(con).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_then_restart_on_same_port_and_manager_reconnects() {
    let mut server = RedisServer::start().unwrap();
    let port = server.port();
    let pid = server.pid().unwrap();
    let client = server.client();
    let config = ConnectionManagerConfig::new()
        .set_response_timeout(Some(Duration::from_millis(500)))
        .set_connection_timeout(Some(Duration::from_millis(500)))
        .set_max_delay(Duration::from_millis(200));
    let mut manager = bounded("connect", client.get_connection_manager_with_config(config)).await.unwrap();
    bounded("SET", redis::cmd("SET").arg("k").arg("v").exec_async(&mut manager)).await.unwrap();
    let mut sync_con = server.connection().unwrap();

    server.kill().unwrap();

    assert!(!server.is_running());
    assert_eq!(server.pid(), None);
    assert_eq!(
        signal::kill(Pid::from_raw(i32::try_from(pid).unwrap()), None),
        Err(Errno::ESRCH),
        "pid {pid} still exists after kill()"
    );
    assert!(redis::cmd("PING").exec(&mut sync_con).is_err());
    let refused =
        client.get_connection_with_timeout(Duration::from_millis(500)).err().expect("connected to a killed server");
    assert!(refused.is_connection_refusal(), "{refused:?}");
    let down = bounded("PING while down", ping(&mut manager)).await;
    assert!(down.is_err(), "PING succeeded on a killed server: {down:?}");

    server.restart().unwrap();
    assert_eq!(server.port(), port);
    assert_ne!(server.pid(), Some(pid));

    // The manager created before the kill reconnects by itself.
    let deadline = Instant::now() + AWAIT_BOUND;
    let mut failures = 0;
    loop {
        match bounded("PING after restart", ping(&mut manager)).await {
            Ok(pong) => {
                assert_eq!(pong, "PONG");
                break;
            }
            Err(err) => {
                failures += 1;
                assert!(
                    Instant::now() < deadline,
                    "manager did not reconnect within {AWAIT_BOUND:?} ({failures} failures, last: {err:?})"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
    let value: Option<String> = bounded("GET", redis::cmd("GET").arg("k").query_async(&mut manager)).await.unwrap();
    assert_eq!(value, None, "data survived kill -9 + restart with persistence off");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paused_server_times_out_commands_then_resumes() {
    let mut server = RedisServer::start().unwrap();
    let client = server.client();
    let timeout = Duration::from_millis(300);
    let async_config =
        AsyncConnectionConfig::new().set_response_timeout(Some(timeout)).set_connection_timeout(Some(timeout));
    let mut async_con =
        bounded("connect", client.get_multiplexed_async_connection_with_config(&async_config)).await.unwrap();
    let mut sync_con = client.get_connection_with_timeout(timeout).unwrap();
    sync_con.set_read_timeout(Some(timeout)).unwrap();

    server.pause().unwrap();
    assert!(server.is_paused());
    assert!(server.is_running(), "a paused server is still running");

    // Async: the response timeout fires; the error is an I/O TimedOut.
    let started = Instant::now();
    let err = bounded("PING while paused", async { redis::cmd("PING").query_async::<String>(&mut async_con).await })
        .await
        .unwrap_err();
    let elapsed = started.elapsed();
    assert!(err.is_timeout(), "{err:?}");
    assert!(elapsed >= timeout && elapsed < Duration::from_secs(2), "{elapsed:?}");

    // Sync: the read timeout fires.
    let started = Instant::now();
    let err = redis::cmd("PING").query::<String>(&mut sync_con).unwrap_err();
    assert!(err.is_timeout(), "{err:?}");
    assert!(started.elapsed() < Duration::from_secs(2), "{:?}", started.elapsed());

    // New connections are accepted by the kernel but the handshake times out.
    let started = Instant::now();
    let err = client.get_connection_with_timeout(timeout).err().expect("handshake with a paused server succeeded");
    assert!(err.is_timeout(), "{err:?}");
    assert!(!err.is_connection_refusal(), "{err:?}");
    assert!(started.elapsed() < Duration::from_secs(2), "{:?}", started.elapsed());

    server.resume().unwrap();
    assert!(!server.is_paused());

    // The same async connection works again (the late PONG is discarded).
    let pong: String = bounded("PING after resume", redis::cmd("PING").query_async(&mut async_con)).await.unwrap();
    assert_eq!(pong, "PONG");
    let mut fresh = server.connection().unwrap();
    redis::cmd("SET").arg("k").arg("v").exec(&mut fresh).unwrap();
    let value: String =
        bounded("GET after resume", redis::cmd("GET").arg("k").query_async(&mut async_con)).await.unwrap();
    assert_eq!(value, "v");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flush_scripts_causes_noscript_and_invoke_reloads() {
    let server = RedisServer::start().unwrap();
    let mut con = bounded("connect", server.client().get_connection_manager()).await.unwrap();
    let script = redis::Script::new("return tonumber(ARGV[1]) + 1");
    let evalsha = || {
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(script.get_hash()).arg(0).arg(41);
        cmd
    };

    let sha = bounded("SCRIPT LOAD", script.load_async(&mut con)).await.unwrap();
    assert_eq!(sha, script.get_hash());
    let answer: i64 = bounded("EVALSHA", evalsha().query_async(&mut con)).await.unwrap();
    assert_eq!(answer, 42);

    server.flush_scripts().unwrap();

    let err = bounded("EVALSHA after flush", evalsha().query_async::<i64>(&mut con)).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Server(ServerErrorKind::NoScript), "{err:?}");
    assert_eq!(err.code(), Some("NOSCRIPT"), "{err:?}");
    assert!(!err.is_unrecoverable_error(), "NOSCRIPT must not force a reconnect");

    let answer: i64 = bounded("invoke_async", script.arg(41).invoke_async(&mut con)).await.unwrap();
    assert_eq!(answer, 42);
    // invoke_async loaded it again, so the raw EVALSHA works once more.
    let answer: i64 = bounded("EVALSHA after reload", evalsha().query_async(&mut con)).await.unwrap();
    assert_eq!(answer, 42);
}
