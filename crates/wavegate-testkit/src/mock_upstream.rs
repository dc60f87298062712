//! A mock HTTP provider on loopback that counts the calls it serves at once.
//!
//! It is the referee of concurrency tests: whatever the scheduler believes, the mock counts
//! what really arrives. It runs on its own thread with its own runtime, so it keeps serving
//! (and counting) whatever the test's runtime does. Beyond an optional hidden capacity it
//! answers `429 Too Many Requests` with a `Retry-After`, like a saturated provider.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::server_thread::ServerThread;

/// How the mock behaves.
#[derive(Debug, Clone)]
pub struct MockUpstreamConfig {
    /// Calls served at once before it answers 429 (`None`: never).
    pub capacity: Option<usize>,
    /// How long a served call takes.
    pub service_time: Duration,
    /// The `Retry-After` sent with a 429.
    pub retry_after: String,
    /// The share of calls (in `[0, 1]`) answered with [`fault`](Self::fault) instead of being
    /// served, drawn from [`fault_seed`](Self::fault_seed) by arrival order. Default 0.
    pub fault_rate: f64,
    /// What a faulty call gets: `Some(status)` (a `500`, a `400`, ...) or `None`, the
    /// connection closed before any byte of the answer. Default `Some(500)`.
    pub fault: Option<u16>,
    /// The seed of the draw of faulty calls.
    pub fault_seed: u64,
}

impl Default for MockUpstreamConfig {
    fn default() -> Self {
        Self {
            capacity: None,
            service_time: Duration::from_millis(2),
            retry_after: "1".to_string(),
            fault_rate: 0.0,
            fault: Some(500),
            fault_seed: 1,
        }
    }
}

impl MockUpstreamConfig {
    /// Whether call number `index` (by arrival, from 0) is faulty: a splitmix64 draw of the
    /// seed and the index, below the fault rate.
    fn is_faulty(&self, index: u64) -> bool {
        let mut z = self.fault_seed.wrapping_add(index.wrapping_add(1).wrapping_mul(0x9E37_79B9_7F4A_7C15));
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        ((z >> 11) as f64 / (1u64 << 53) as f64) < self.fault_rate
    }
}

#[derive(Debug, Default)]
struct Counters {
    /// When each request arrived (its head fully read), in arrival order.
    arrivals: std::sync::Mutex<Vec<std::time::Instant>>,
    /// When each call began and ended (its reply written or failed), in order of ending.
    spans: std::sync::Mutex<Vec<(std::time::Instant, std::time::Instant)>>,
    in_flight: AtomicUsize,
    max_in_flight: AtomicUsize,
    served: AtomicU64,
    rate_limited: AtomicU64,
    faulted: AtomicU64,
}

/// A running mock provider; stops on drop.
#[derive(Debug)]
pub struct MockUpstream {
    server: ServerThread,
    counters: Arc<Counters>,
}

impl MockUpstream {
    /// Starts serving on a free port of 127.0.0.1.
    pub fn start(config: MockUpstreamConfig) -> io::Result<Self> {
        let counters = Arc::new(Counters::default());
        let served = counters.clone();
        let server = ServerThread::start("mock-upstream", move |listener| serve(listener, config, served))?;
        Ok(Self { server, counters })
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.server.addr()
    }

    /// Calls being served now.
    pub fn in_flight(&self) -> usize {
        self.counters.in_flight.load(Ordering::SeqCst)
    }

    /// The most calls ever served at once (429s included while they were being answered).
    pub fn max_in_flight(&self) -> usize {
        self.counters.max_in_flight.load(Ordering::SeqCst)
    }

    /// Forgets the maximum so far (e.g. between phases of a test).
    pub fn reset_max_in_flight(&self) {
        self.counters.max_in_flight.store(self.in_flight(), Ordering::SeqCst);
    }

    /// When each request arrived, by the mock's own clock, in arrival order.
    pub fn arrivals(&self) -> Vec<std::time::Instant> {
        self.counters.arrivals.lock().map(|a| a.clone()).unwrap_or_default()
    }

    /// When each call began (its head read) and ended (its reply written, or the write
    /// failed), by the mock's own clock, in order of ending: how many ran at once at any moment.
    pub fn spans(&self) -> Vec<(std::time::Instant, std::time::Instant)> {
        self.counters.spans.lock().map(|s| s.clone()).unwrap_or_default()
    }

    /// Calls answered 200.
    pub fn served(&self) -> u64 {
        self.counters.served.load(Ordering::SeqCst)
    }

    /// Calls answered 429.
    pub fn rate_limited(&self) -> u64 {
        self.counters.rate_limited.load(Ordering::SeqCst)
    }

    /// Calls answered with the configured fault (a status, or a closed connection).
    pub fn faulted(&self) -> u64 {
        self.counters.faulted.load(Ordering::SeqCst)
    }

    /// Every call that arrived.
    pub fn calls(&self) -> u64 {
        self.counters.arrivals.lock().map(|a| a.len() as u64).unwrap_or_default()
    }
}

async fn serve(listener: TcpListener, config: MockUpstreamConfig, counters: Arc<Counters>) {
    let config = Arc::new(config);
    loop {
        let Ok((stream, _)) = listener.accept().await else { continue };
        let (config, counters) = (config.clone(), counters.clone());
        tokio::spawn(async move {
            let _ = answer(stream, &config, &counters).await;
        });
    }
}

async fn answer(mut stream: TcpStream, config: &MockUpstreamConfig, counters: &Counters) -> io::Result<()> {
    read_request_head(&mut stream).await?;
    let began = std::time::Instant::now();
    let index = match counters.arrivals.lock() {
        Ok(mut arrivals) => {
            arrivals.push(began);
            arrivals.len() as u64 - 1
        }
        Err(_) => 0,
    };
    let now = counters.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
    counters.max_in_flight.fetch_max(now, Ordering::SeqCst);
    let over = config.capacity.is_some_and(|capacity| now > capacity);
    let faulty = !over && config.is_faulty(index);
    if faulty {
        counters.faulted.fetch_add(1, Ordering::SeqCst);
    }
    let response = if faulty {
        match config.fault {
            Some(status) => format!("HTTP/1.1 {status} Fault\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"),
            // Closed before any byte of the answer.
            None => String::new(),
        }
    } else if over {
        counters.rate_limited.fetch_add(1, Ordering::SeqCst);
        format!(
            "HTTP/1.1 429 Too Many Requests\r\nRetry-After: {}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
            config.retry_after
        )
    } else {
        tokio::time::sleep(config.service_time).await;
        counters.served.fetch_add(1, Ordering::SeqCst);
        "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok".to_string()
    };
    let written = stream.write_all(response.as_bytes()).await;
    counters.in_flight.fetch_sub(1, Ordering::SeqCst);
    if let Ok(mut spans) = counters.spans.lock() {
        spans.push((began, std::time::Instant::now()));
    }
    written?;
    stream.shutdown().await
}

/// Reads an HTTP request head (up to the blank line), at most 16 KiB, within 5 s: what a mock
/// server needs before it answers.
pub async fn read_request_head(stream: &mut TcpStream) -> io::Result<Vec<u8>> {
    let read = async {
        let mut head = Vec::with_capacity(256);
        let mut buf = [0u8; 1024];
        while !head.windows(4).any(|w| w == b"\r\n\r\n") {
            let n = stream.read(&mut buf).await?;
            if n == 0 || head.len() > 16 * 1024 {
                return Err(io::Error::new(io::ErrorKind::InvalidData, "incomplete request head"));
            }
            head.extend_from_slice(&buf[..n]);
        }
        Ok(head)
    };
    tokio::time::timeout(Duration::from_secs(5), read).await.map_err(|_| io::Error::from(io::ErrorKind::TimedOut))?
}
