//! Network faults between redis-rs clients and a real Redis, injected by `FaultProxy`.

use std::net::TcpStream;
use std::time::{Duration, Instant};

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{Connection, RedisError, RedisResult};
use wavegate_testkit::{Fault, FaultProxy, RedisServer};

/// Connect bound through the proxy when it forwards.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// Read/write bound of the connections that expect a fault.
const IO_TIMEOUT: Duration = Duration::from_millis(300);
/// Bound on an await in the async test, so a broken harness fails instead of hanging.
const AWAIT_BOUND: Duration = Duration::from_secs(5);

fn start() -> (RedisServer, FaultProxy) {
    let server = RedisServer::start().unwrap();
    let proxy = FaultProxy::start(server.addr()).unwrap();
    (server, proxy)
}

/// A connection through the proxy with `io_timeout` on reads and writes.
fn connect_with(proxy: &FaultProxy, connect_timeout: Duration, io_timeout: Duration) -> RedisResult<Connection> {
    let con = redis::Client::open(proxy.url())?.get_connection_with_timeout(connect_timeout)?;
    con.set_read_timeout(Some(io_timeout))?;
    con.set_write_timeout(Some(io_timeout))?;
    Ok(con)
}

fn connect(proxy: &FaultProxy) -> Connection {
    connect_with(proxy, CONNECT_TIMEOUT, IO_TIMEOUT).unwrap()
}

fn ping(con: &mut Connection) -> RedisResult<String> {
    redis::cmd("PING").query(con)
}

fn is_broken_connection(err: &RedisError) -> bool {
    err.is_io_error() || err.is_connection_dropped() || err.is_connection_refusal()
}

async fn bounded<F: Future>(fut: F) -> F::Output {
    tokio::time::timeout(AWAIT_BOUND, fut).await.expect("an await exceeded its bound")
}

/// A connection manager through the proxy that fails fast: `IO_TIMEOUT` to connect and per
/// response, no retries.
async fn manager(proxy: &FaultProxy) -> ConnectionManager {
    let config = ConnectionManagerConfig::new()
        .set_response_timeout(Some(IO_TIMEOUT))
        .set_connection_timeout(Some(IO_TIMEOUT))
        .set_number_of_retries(0);
    let client = redis::Client::open(proxy.url()).unwrap();
    bounded(client.get_connection_manager_with_config(config)).await.unwrap()
}

/// Sends `cmd` until it succeeds (within `AWAIT_BOUND`); returns its value and the errors before.
async fn until_ok(manager: &mut ConnectionManager, cmd: redis::Cmd) -> (redis::Value, Vec<RedisError>) {
    let deadline = Instant::now() + AWAIT_BOUND;
    let mut failures = Vec::new();
    loop {
        match bounded(cmd.query_async(manager)).await {
            Ok(value) => return (value, failures),
            Err(err) if Instant::now() < deadline => {
                failures.push(err);
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(err) => panic!("no recovery: {err:?} after {failures:?}"),
        }
    }
}

#[test]
fn no_fault_forwards_commands() {
    let (server, proxy) = start();
    assert_eq!(proxy.fault(), Fault::None);
    assert_eq!(proxy.target(), server.addr());
    assert_eq!(proxy.url(), format!("redis://127.0.0.1:{}/", proxy.addr().port()));

    let mut con = connect(&proxy);
    redis::cmd("SET").arg("k").arg("v").exec(&mut con).unwrap();
    let value: String = redis::cmd("GET").arg("k").query(&mut con).unwrap();
    assert_eq!(value, "v");
    assert_eq!(proxy.connections(), 1);

    // The write really reached the server.
    let value: String = redis::cmd("GET").arg("k").query(&mut server.connection().unwrap()).unwrap();
    assert_eq!(value, "v");
}

#[test]
fn black_hole_times_out_then_new_connections_work_again() {
    let (_server, proxy) = start();
    let mut con = connect(&proxy);
    let mut idle = connect(&proxy);
    assert_eq!(ping(&mut con).unwrap(), "PONG");

    proxy.set_fault(Fault::BlackHole);
    assert_eq!(proxy.fault(), Fault::BlackHole);
    let started = Instant::now();
    let err = ping(&mut con).unwrap_err();
    assert!(err.is_timeout(), "{err:?}");
    assert!(started.elapsed() < Duration::from_secs(1), "took {:?}", started.elapsed());

    // New connections are accepted but their setup is swallowed too.
    let started = Instant::now();
    let err = connect_with(&proxy, IO_TIMEOUT, IO_TIMEOUT).err().expect("connected through a black hole");
    assert!(err.is_timeout(), "{err:?}");
    // redis-rs takes about twice its connect timeout here (~650 ms): it bounds the TCP connect
    // and then the setup reads.
    assert!(started.elapsed() < Duration::from_millis(1500), "took {:?}", started.elapsed());
    // Nothing was closed: the client's side is still held by the proxy.
    assert_eq!(proxy.connections(), 3);

    // Leaving the black hole resets the connections that lost bytes in it, and only those.
    proxy.set_fault(Fault::None);
    assert_eq!(proxy.connections(), 1);
    let err = ping(&mut con).unwrap_err();
    assert!(is_broken_connection(&err), "{err:?}");
    assert_eq!(ping(&mut idle).unwrap(), "PONG");
    assert_eq!(ping(&mut connect(&proxy)).unwrap(), "PONG");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn black_hole_times_out_a_connection_manager_which_recovers_after() {
    let (_server, proxy) = start();
    let mut manager = manager(&proxy).await;
    redis::cmd("PING").exec_async(&mut manager).await.unwrap();

    proxy.set_fault(Fault::BlackHole);
    let started = Instant::now();
    let err = bounded(redis::cmd("PING").exec_async(&mut manager)).await.unwrap_err();
    assert!(err.is_timeout(), "{err:?}");
    assert!(started.elapsed() < Duration::from_secs(1), "took {:?}", started.elapsed());

    proxy.set_fault(Fault::None);
    let (pong, failures) = until_ok(&mut manager, redis::cmd("PING")).await;
    assert_eq!(pong, redis::Value::SimpleString("PONG".into()), "after {failures:?}");
    assert!(failures.iter().all(is_broken_connection), "{failures:?}");
}

#[test]
fn refuse_resets_open_and_new_connections_fast() {
    let (_server, proxy) = start();
    let mut open = connect(&proxy);
    assert_eq!(ping(&mut open).unwrap(), "PONG");

    proxy.set_fault(Fault::Refuse);
    assert_eq!(proxy.connections(), 0);

    let started = Instant::now();
    let err = ping(&mut open).unwrap_err();
    assert!(is_broken_connection(&err), "{err:?}");
    assert!(started.elapsed() < Duration::from_millis(500), "took {:?}", started.elapsed());

    let started = Instant::now();
    let err = connect_with(&proxy, CONNECT_TIMEOUT, CONNECT_TIMEOUT).err().expect("connected while refused");
    assert!(is_broken_connection(&err), "{err:?}");
    assert!(started.elapsed() < Duration::from_millis(500), "took {:?}", started.elapsed());
    assert_eq!(proxy.connections(), 0);

    proxy.set_fault(Fault::None);
    assert_eq!(ping(&mut connect(&proxy)).unwrap(), "PONG");
}

#[test]
fn latency_delays_each_direction() {
    let (_server, proxy) = start();
    let mut con = connect_with(&proxy, CONNECT_TIMEOUT, Duration::from_secs(2)).unwrap();
    assert_eq!(ping(&mut con).unwrap(), "PONG");

    let delay = Duration::from_millis(150);
    proxy.set_fault(Fault::Latency(delay));
    let started = Instant::now();
    assert_eq!(ping(&mut con).unwrap(), "PONG");
    let elapsed = started.elapsed();
    // The request and the reply are each delayed.
    assert!(elapsed >= 2 * delay, "took {elapsed:?}");
    assert!(elapsed < Duration::from_secs(2), "took {elapsed:?}");

    proxy.set_fault(Fault::None);
    let started = Instant::now();
    assert_eq!(ping(&mut con).unwrap(), "PONG");
    assert!(started.elapsed() < delay, "took {:?}", started.elapsed());
}

#[test]
fn drop_next_reply_loses_the_reply_but_the_command_runs() {
    let (server, proxy) = start();
    // Connect before arming: connecting sends commands too.
    let mut con = connect(&proxy);
    let mut other = connect(&proxy);
    let mut direct = server.connection().unwrap();

    proxy.set_fault(Fault::DropNextReply);
    let started = Instant::now();
    let err = redis::cmd("INCR").arg("k").query::<i64>(&mut con).unwrap_err();
    assert!(err.is_timeout(), "{err:?}");
    assert!(started.elapsed() < Duration::from_secs(1), "took {:?}", started.elapsed());
    assert_eq!(proxy.fault(), Fault::None, "the fault fires once");

    let ran: i64 = redis::cmd("GET").arg("k").query(&mut direct).unwrap();
    assert_eq!(ran, 1, "the command did not run on the server");

    // The connection that lost the reply breaks at its next command, which does not run.
    let err = redis::cmd("INCR").arg("k").query::<i64>(&mut con).unwrap_err();
    assert!(is_broken_connection(&err), "{err:?}");
    let ran: i64 = redis::cmd("GET").arg("k").query(&mut direct).unwrap();
    assert_eq!(ran, 1);

    // Other connections, open or new, are unaffected.
    let value: i64 = redis::cmd("INCR").arg("k").query(&mut other).unwrap();
    assert_eq!(value, 2);
    let value: i64 = redis::cmd("INCR").arg("k").query(&mut connect(&proxy)).unwrap();
    assert_eq!(value, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drop_next_reply_times_out_a_connection_manager_which_then_reconnects() {
    let (server, proxy) = start();
    let mut manager = manager(&proxy).await;
    redis::cmd("PING").exec_async(&mut manager).await.unwrap();

    proxy.set_fault(Fault::DropNextReply);
    let lost = bounded(redis::cmd("INCR").arg("k").query_async::<i64>(&mut manager)).await.unwrap_err();
    assert!(lost.is_timeout(), "{lost:?}");
    let ran: i64 = redis::cmd("GET").arg("k").query(&mut server.connection().unwrap()).unwrap();
    assert_eq!(ran, 1);

    // The next command breaks the connection; the manager reconnects and carries on.
    let (value, failures) = until_ok(&mut manager, redis::cmd("INCR").arg("k").clone()).await;
    assert_eq!(value, redis::Value::Int(2), "after {failures:?}");
    assert!(!failures.is_empty(), "the connection that lost a reply went on");
    assert!(failures.iter().all(is_broken_connection), "{failures:?}");
}

#[test]
fn reset_connections_breaks_open_ones_only() {
    let (_server, proxy) = start();
    let mut first = connect(&proxy);
    let mut second = connect(&proxy);
    assert_eq!(ping(&mut first).unwrap(), "PONG");
    assert_eq!(proxy.connections(), 2);

    proxy.reset_connections();
    assert_eq!(proxy.connections(), 0);
    assert_eq!(proxy.fault(), Fault::None);
    for con in [&mut first, &mut second] {
        let err = ping(con).unwrap_err();
        assert!(is_broken_connection(&err), "{err:?}");
    }

    let mut fresh = connect(&proxy);
    assert_eq!(ping(&mut fresh).unwrap(), "PONG");
    assert_eq!(proxy.connections(), 1);
}

#[test]
fn drop_closes_the_port_and_the_connections() {
    let (_server, proxy) = start();
    let addr = proxy.addr();
    let mut con = connect(&proxy);
    assert_eq!(ping(&mut con).unwrap(), "PONG");

    drop(proxy);

    let err = TcpStream::connect_timeout(&addr, Duration::from_millis(500)).expect_err("the port is still open");
    assert_eq!(err.kind(), std::io::ErrorKind::ConnectionRefused, "{err:?}");
    let err = ping(&mut con).unwrap_err();
    assert!(is_broken_connection(&err), "{err:?}");
}
