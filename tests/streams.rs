//! Streamed answers (`RequestBuilder::call_stream`, feature `sse`): the permit is held until
//! the stream ends or is dropped, renewed past its lease, and the tokens budget is settled
//! from the stream's final usage — against a mock provider that streams server-sent events
//! slowly and counts the streams it really has open.
//!
//! Run with `cargo test -p wavegate --features sse --test streams` (CI does).

use std::io;
use std::net::SocketAddr;
use std::time::{Duration, Instant, SystemTime};

use futures_util::{Stream, StreamExt};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use wavegate::{ErrorKind, Outcome, Scheduler, SseUsage, TransportError, Upstream, UpstreamConfig};
use wavegate_testkit::{MockSse, MockSseConfig, RedisServer, SseStyle};

mod common;

/// The answer's bytes after its head, as they arrive (chunked framing included: the chunk-size
/// lines are not `data:` lines, and the mock writes whole events per chunk).
type Body = std::pin::Pin<Box<dyn Stream<Item = io::Result<Vec<u8>>> + Send>>;

/// `GET /` to the mock: its head read (a status other than 200 as an error `Outcome`), its body
/// as a stream of byte chunks.
async fn open_stream(addr: SocketAddr) -> Result<Body, Outcome> {
    let connect = Outcome::from_transport(TransportError::Connect);
    let mut tcp = TcpStream::connect(addr).await.map_err(|_| connect)?;
    let request = format!("GET / HTTP/1.1\r\nHost: {addr}\r\nAccept: text/event-stream\r\n\r\n");
    tcp.write_all(request.as_bytes()).await.map_err(|_| connect)?;
    let mut head = Vec::new();
    let mut buf = [0u8; 4096];
    let end = loop {
        let n = tcp.read(&mut buf).await.map_err(|_| Outcome::from_transport(TransportError::Reset))?;
        if n == 0 {
            return Err(Outcome::from_transport(TransportError::Reset));
        }
        head.extend_from_slice(&buf[..n]);
        if let Some(at) = head.windows(4).position(|w| w == b"\r\n\r\n") {
            break at + 4;
        }
    };
    let status: u16 =
        String::from_utf8_lossy(&head[..end]).split_whitespace().nth(1).and_then(|code| code.parse().ok()).unwrap_or(0);
    if status != 200 {
        return Err(Outcome::from_status(status, Some("0"), SystemTime::now()));
    }
    let rest = head.split_off(end);
    let first = futures_util::stream::iter((!rest.is_empty()).then_some(Ok(rest)));
    let more = futures_util::stream::unfold(tcp, |mut tcp| async move {
        let mut buf = vec![0u8; 4096];
        match tcp.read(&mut buf).await {
            Ok(0) => None,
            Ok(n) => {
                buf.truncate(n);
                Some((Ok(buf), tcp))
            }
            Err(error) => Some((Err(error), tcp)),
        }
    });
    Ok(Box::pin(first.chain(more)))
}

fn upstream(limit: u32) -> UpstreamConfig {
    UpstreamConfig::builder("llm").limit(limit).max_wait(Duration::from_secs(20)).build().expect("config")
}

fn local(config: UpstreamConfig) -> (Scheduler, Upstream) {
    let scheduler = common::isolated().upstream(config).build().expect("scheduler");
    let llm = scheduler.upstream("llm").expect("configured");
    (scheduler, llm)
}

/// One streamed call read to its end: its bytes.
async fn stream_to_end(llm: &Upstream, addr: SocketAddr) -> usize {
    let mut answer =
        llm.request().meter(SseUsage::new()).call_stream(|_| open_stream(addr), |body| body).await.expect("a stream");
    let mut bytes = 0;
    while let Some(chunk) = answer.next().await {
        bytes += chunk.expect("a chunk").len();
    }
    bytes
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_hold_their_permit_to_their_end() {
    let mock = MockSse::start(MockSseConfig::default()).expect("mock");
    let (_scheduler, llm) = local(upstream(2));
    let started = Instant::now();
    let read = futures_util::future::join_all((0..6).map(|_| stream_to_end(&llm, mock.addr()))).await;
    assert!(read.iter().all(|&bytes| bytes > 1000), "{read:?}");
    assert_eq!(mock.completed(), 6);
    assert_eq!(mock.max_open(), 2, "the provider had {} streams open with a limit of 2", mock.max_open());
    // Three rounds of two 1 s streams.
    assert!(started.elapsed() >= Duration::from_millis(2900), "{:?}", started.elapsed());
    assert_eq!(llm.status().await.expect("status").in_flight_local, 0);
}

/// The bug class the held stream fixes: `call` releases the permit when its closure returns, so
/// a stream returned by it holds nothing while it runs, and the provider sees them all at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_returned_by_call_holds_nothing_while_it_runs() {
    let mock = MockSse::start(MockSseConfig::default()).expect("mock");
    let (_scheduler, llm) = local(upstream(2));
    let addr = mock.addr();
    let streams = futures_util::future::join_all((0..6).map(|_| llm.request().call(|_| open_stream(addr)))).await;
    let read = futures_util::future::join_all(streams.into_iter().map(|stream| async move {
        let mut stream = stream.expect("a stream");
        while stream.next().await.is_some() {}
    }));
    read.await;
    assert!(mock.max_open() > 2, "with call, the provider still saw only {} streams at once", mock.max_open());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_dropped_halfway_frees_its_permit_at_once() {
    let mock = MockSse::start(MockSseConfig::default()).expect("mock");
    let (_scheduler, llm) = local(upstream(1));
    let mut answer = llm.request().call_stream(|_| open_stream(mock.addr()), |body| body).await.expect("a stream");
    for _ in 0..5 {
        answer.next().await.expect("an item").expect("a chunk");
    }
    assert!(answer.is_holding());
    assert_eq!(llm.status().await.expect("status").in_flight_local, 1);
    let dropped = Instant::now();
    drop(answer);
    let next = llm.request().acquire().await.expect("a permit");
    assert!(dropped.elapsed() < Duration::from_millis(200), "the next caller waited {:?}", dropped.elapsed());
    drop(next);
    // The provider saw the connection close before the end.
    let deadline = Instant::now() + Duration::from_secs(3);
    while mock.hung_up() < 1 {
        assert!(Instant::now() < deadline, "the provider did not see the stream dropped");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(mock.completed(), 0);
}

fn short_lease() -> UpstreamConfig {
    UpstreamConfig::builder("llm")
        .limit(1)
        .renewed_lease(Duration::from_secs(1))
        .max_wait(Duration::from_secs(10))
        .build()
        .expect("config")
}

/// A stream three times longer than its 1 s lease, streamed through `a`: a caller of `b` gets
/// no permit until it ends (the lease was renewed), then gets one at once.
async fn outlives_its_lease(a: Upstream, b: Upstream) {
    let mock = MockSse::start(MockSseConfig { chunks: 60, ..Default::default() }).expect("mock");
    let addr = mock.addr();
    let streamed = tokio::spawn(async move {
        let bytes = stream_to_end(&a, addr).await;
        (bytes, Instant::now())
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(mock.open(), 1);
    // Over two leases (and their renewals) pass while the other caller waits.
    let refused = b
        .request()
        .timeout(Duration::from_millis(2200))
        .acquire()
        .await
        .expect_err("a permit while the stream held it");
    assert_eq!(refused.kind(), ErrorKind::DeadlinePassed, "{refused}");
    assert_eq!(mock.open(), 1, "the stream ended early");
    let permit = b.request().acquire().await.expect("a permit once the stream ended");
    let got = Instant::now();
    let (bytes, ended) = streamed.await.expect("the streaming task");
    assert!(bytes > 3000);
    assert!(got >= ended || ended.duration_since(got) < Duration::from_millis(50), "a permit before the stream ended");
    assert_eq!(mock.max_open(), 1);
    drop(permit);
}

/// In shared mode: the lease in Redis is renewed; another process waits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_longer_than_its_lease_keeps_its_permit() {
    let redis = RedisServer::start().expect("redis-server");
    let build = || Scheduler::builder().upstream(short_lease()).redis(redis.url()).build().expect("scheduler");
    let (a, b) = (build(), build());
    outlives_its_lease(a.upstream("llm").expect("configured"), b.upstream("llm").expect("configured")).await;
}

/// In local mode: the in-process gate's lease is renewed too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_longer_than_its_lease_keeps_its_permit_in_local_mode() {
    let (_scheduler, llm) = local(short_lease());
    outlives_its_lease(llm.clone(), llm).await;
}

/// The tokens budget: `estimate` reserved while the stream runs, the final usage settled at its
/// end (12 + 20 = 32 tokens here), for OpenAI's and Anthropic's events.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_are_settled_from_the_final_usage() {
    for style in [SseStyle::OpenAi, SseStyle::Anthropic] {
        let mock = MockSse::start(MockSseConfig { chunks: 10, style, ..Default::default() }).expect("mock");
        // 60 tokens a minute: one a second comes back, so the figures stay put during the test.
        let config = UpstreamConfig::builder("llm")
            .limit(2)
            .tokens_per_minute(60, 10_000)
            .max_wait(Duration::from_secs(5))
            .build()
            .expect("config");
        let (_scheduler, llm) = local(config);
        let tokens = || async { llm.status().await.expect("status").budgets.tokens.expect("a tokens budget").0 };
        assert_eq!(tokens().await, 10_000);
        let mut answer = llm
            .request()
            .tokens(5_000)
            .meter(SseUsage::new())
            .call_stream(|_| open_stream(mock.addr()), |body| body)
            .await
            .expect("a stream");
        answer.next().await.expect("an item").expect("a chunk");
        let during = tokens().await;
        assert!((5_000..5_010).contains(&during), "{style:?}: {during} tokens left while the stream ran");
        while let Some(chunk) = answer.next().await {
            chunk.expect("a chunk");
        }
        assert_eq!(answer.tokens_used(), Some(32), "{style:?}");
        let after = tokens().await;
        assert!((9_960..=10_000).contains(&after), "{style:?}: {after} tokens left after the stream (32 used)");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_429_before_the_stream_began_is_retried() {
    let mock = MockSse::start(MockSseConfig { chunks: 3, reject_first: 1, ..Default::default() }).expect("mock");
    let (_scheduler, llm) = local(upstream(1));
    let bytes = stream_to_end(&llm, mock.addr()).await;
    assert!(bytes > 100);
    assert_eq!((mock.rejected(), mock.completed(), mock.calls()), (1, 1, 2));
}

/// A stream that outlives its call timeout is cut: a timeout error, and the permit goes back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_past_its_call_timeout_ends_with_a_timeout() {
    let mock = MockSse::start(MockSseConfig::default()).expect("mock");
    let config =
        UpstreamConfig::builder("llm").limit(1).call_timeout(Duration::from_millis(400)).build().expect("config");
    let (_scheduler, llm) = local(config);
    let mut answer = llm.request().call_stream(|_| open_stream(mock.addr()), |body| body).await.expect("a stream");
    let started = Instant::now();
    let error = loop {
        match answer.next().await.expect("an item before the end") {
            Ok(_) => continue,
            Err(error) => break error,
        }
    };
    assert!(started.elapsed() < Duration::from_millis(600), "{:?}", started.elapsed());
    assert_eq!(error.kind(), ErrorKind::Upstream);
    assert!(matches!(error.outcome(), Some(Outcome::Transient { .. })), "{error}");
    assert!(answer.next().await.is_none());
    assert!(!answer.is_holding());
    assert_eq!(llm.status().await.expect("status").in_flight_local, 0);
}

/// An error item midway: reported as what it says (a reset: transient), given back inside an
/// `Error` with the stream's own error, not retried; the permit goes back.
#[tokio::test]
async fn an_error_midway_is_reported_and_not_retried() {
    let (_scheduler, llm) = local(upstream(1));
    let mut calls = 0;
    let mut answer = llm
        .request()
        .call_stream(
            |_| {
                calls += 1;
                async {
                    Ok::<_, Outcome>(futures_util::stream::iter([
                        Ok(b"data: {}\n\n".to_vec()),
                        Err(io::Error::from(io::ErrorKind::ConnectionReset)),
                    ]))
                }
            },
            |stream| stream,
        )
        .await
        .expect("a stream");
    assert!(answer.next().await.expect("an item").is_ok());
    let error = answer.next().await.expect("an item").expect_err("the reset");
    assert_eq!(error.kind(), ErrorKind::Upstream);
    assert!(matches!(error.outcome(), Some(Outcome::Transient { .. })), "{error}");
    assert_eq!(error.source_error().map(io::Error::kind), Some(io::ErrorKind::ConnectionReset));
    assert!(!answer.is_holding());
    assert!(answer.next().await.is_none());
    drop(answer);
    assert_eq!(calls, 1, "a failure after the stream began was retried");
    assert_eq!(llm.status().await.expect("status").in_flight_local, 0);
}

/// A pool's streamed answers hold their member's permit to their end: two members of limit 1,
/// four callers, never more than two streams open at the provider.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pools_streams_hold_their_members_permits() {
    let mock = MockSse::start(MockSseConfig { chunks: 10, ..Default::default() }).expect("mock");
    let member =
        |name: &str| UpstreamConfig::builder(name).limit(1).max_wait(Duration::from_secs(10)).build().expect("config");
    let pool = wavegate::PoolConfig::builder("llm").member("key-a", 1).member("key-b", 1).build().expect("pool");
    let scheduler =
        common::isolated().upstream(member("key-a")).upstream(member("key-b")).pool(pool).build().expect("scheduler");
    let llm = scheduler.pool("llm").expect("configured");
    let addr = mock.addr();
    let members = futures_util::future::join_all((0..4).map(|_| async {
        let mut answer = llm
            .request()
            .meter(SseUsage::new())
            .call_stream(|_member, _| open_stream(addr), |body| body)
            .await
            .expect("a stream");
        let member = answer.permit().expect("held").upstream().to_string();
        while let Some(chunk) = answer.next().await {
            chunk.expect("a chunk");
        }
        assert_eq!(answer.tokens_used(), Some(32));
        member
    }))
    .await;
    assert_eq!(mock.completed(), 4);
    assert_eq!(mock.max_open(), 2, "{} streams open at once with two members of limit 1", mock.max_open());
    assert!(members.iter().any(|m| m == "key-a") && members.iter().any(|m| m == "key-b"), "{members:?}");
}

/// A stream that outlives the request's deadline (before its call timeout) ends with
/// `DeadlinePassed`: nothing learned about the upstream, the permit back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_past_its_deadline_ends_with_deadline_passed() {
    let mock = MockSse::start(MockSseConfig::default()).expect("mock");
    let (_scheduler, llm) = local(upstream(1));
    let mut answer = llm
        .request()
        .timeout(Duration::from_millis(400))
        .call_stream(|_| open_stream(mock.addr()), |body| body)
        .await
        .expect("a stream");
    let error = loop {
        match answer.next().await.expect("an item before the end") {
            Ok(_) => continue,
            Err(error) => break error,
        }
    };
    assert_eq!(error.kind(), ErrorKind::DeadlinePassed, "{error}");
    assert!(!answer.is_holding());
    let status = llm.status().await.expect("status");
    assert_eq!((status.in_flight_local, status.breaker), (0, "closed"));
}
