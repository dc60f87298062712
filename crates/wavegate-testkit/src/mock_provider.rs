//! A mock LLM provider on loopback that announces its rate limits in headers.
//!
//! Like [`MockUpstream`](crate::MockUpstream) it is a referee that runs on its own thread and
//! counts what really arrives; unlike it, it enforces requests and tokens budgets per window
//! ([`ProviderLimits`]) and says what is left on every answer, in OpenAI's or Anthropic's
//! headers (see [`provider_limits`](crate::ProviderLimits)). A call reserves the tokens named
//! in its path's query (`GET /anything?tokens=250`; none: 0). A refused call is answered at
//! once with 429, `retry-after` and the provider's error body, and costs nothing.
//!
//! A [`Hook`] ([`MockProvider::set_hook`]) may rewrite any answer before it is sent (a hostile
//! provider: absurd `Retry-After`s, a skewed clock, a 402), and [`MockProvider::spans`] gives
//! every call's arrival, end, status and path, for a referee that counts what ran at once.

use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use crate::mock_upstream::read_request_head;
use crate::provider_limits::{Answer, ProviderLimits, WindowCounter};
use crate::server_thread::ServerThread;

/// Rewrites an answer before it is sent: given the answer and the request's path. Its status,
/// headers and body go out as it leaves them (a 200 still takes the service time).
pub type Hook = Arc<dyn Fn(&mut Answer, &str) + Send + Sync>;

struct State {
    limits: ProviderLimits,
    windows: WindowCounter,
    hook: Option<Hook>,
}

impl std::fmt::Debug for State {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("State").field("limits", &self.limits).field("hook", &self.hook.is_some()).finish()
    }
}

/// One call as the mock saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProviderCall {
    /// When its head was read.
    pub arrived: Instant,
    /// When its answer was written (or the write failed).
    pub ended: Instant,
    /// The status answered.
    pub status: u16,
    /// The request's path, query included.
    pub path: String,
}

#[derive(Debug, Default)]
struct Counters {
    served: AtomicU64,
    rate_limited: AtomicU64,
    in_flight: AtomicUsize,
    max_in_flight: AtomicUsize,
    /// Every call, in order of answer.
    calls: Mutex<Vec<ProviderCall>>,
}

/// A running mock provider; stops on drop.
#[derive(Debug)]
pub struct MockProvider {
    server: ServerThread,
    state: Arc<Mutex<State>>,
    counters: Arc<Counters>,
}

impl MockProvider {
    /// Starts serving on a free port of 127.0.0.1; a served call takes `service_time`.
    pub fn start(limits: ProviderLimits, service_time: Duration) -> io::Result<Self> {
        let state = Arc::new(Mutex::new(State { limits, windows: WindowCounter::default(), hook: None }));
        let counters = Arc::new(Counters::default());
        let (served_state, served_counters) = (state.clone(), counters.clone());
        let server = ServerThread::start("mock-provider", move |listener| async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else { continue };
                let (state, counters) = (served_state.clone(), served_counters.clone());
                tokio::spawn(async move {
                    let _ = answer(stream, &state, &counters, service_time).await;
                });
            }
        })?;
        Ok(Self { server, state, counters })
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.server.addr()
    }

    /// Changes the limits from the next call on (e.g. the quota runs out, or is paid).
    pub fn set_limits(&self, limits: ProviderLimits) {
        self.state.lock().unwrap_or_else(PoisonError::into_inner).limits = limits;
    }

    /// Rewrites every answer from the next call on with `hook` (`None`: answers as counted).
    pub fn set_hook(&self, hook: Option<Hook>) {
        self.state.lock().unwrap_or_else(PoisonError::into_inner).hook = hook;
    }

    /// Every call's arrival, end, status and path, in order of answer.
    pub fn spans(&self) -> Vec<ProviderCall> {
        self.counters.calls.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// Calls answered 200.
    pub fn served(&self) -> u64 {
        self.counters.served.load(Ordering::SeqCst)
    }

    /// Calls answered 429.
    pub fn rate_limited(&self) -> u64 {
        self.counters.rate_limited.load(Ordering::SeqCst)
    }

    /// The most calls in progress at once.
    pub fn max_in_flight(&self) -> usize {
        self.counters.max_in_flight.load(Ordering::SeqCst)
    }

    /// Every call's arrival and status, in order of answer.
    pub fn calls(&self) -> Vec<(Instant, u16)> {
        let calls = self.counters.calls.lock().unwrap_or_else(PoisonError::into_inner);
        calls.iter().map(|c| (c.arrived, c.status)).collect()
    }
}

/// The tokens a request line reserves: its query's `tokens=N`, else 0.
pub(crate) fn tokens_asked(head: &[u8]) -> u64 {
    let line = head.split(|b| *b == b'\r').next().unwrap_or_default();
    let line = String::from_utf8_lossy(line);
    let query = line.split_whitespace().nth(1).and_then(|path| path.split_once('?')).map(|(_, q)| q);
    query
        .and_then(|q| q.split('&').find_map(|pair| pair.strip_prefix("tokens=")))
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// The path of a request line (`GET /v1?x=1 HTTP/1.1`: `/v1?x=1`), else empty.
fn request_path(head: &[u8]) -> String {
    let line = head.split(|b| *b == b'\r').next().unwrap_or_default();
    String::from_utf8_lossy(line).split_whitespace().nth(1).unwrap_or_default().to_string()
}

async fn answer(
    mut stream: TcpStream,
    state: &Mutex<State>,
    counters: &Counters,
    service_time: Duration,
) -> io::Result<()> {
    let head = read_request_head(&mut stream).await?;
    let arrived = Instant::now();
    let now = counters.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
    counters.max_in_flight.fetch_max(now, Ordering::SeqCst);
    let path = request_path(&head);
    let (reply, hook) = {
        let mut state = state.lock().unwrap_or_else(PoisonError::into_inner);
        let limits = state.limits;
        (state.windows.answer(&limits, arrived, tokens_asked(&head)), state.hook.clone())
    };
    let mut reply = reply;
    if let Some(hook) = hook {
        hook(&mut reply, &path);
    }
    if reply.status == 200 {
        tokio::time::sleep(service_time).await;
        counters.served.fetch_add(1, Ordering::SeqCst);
    } else {
        counters.rate_limited.fetch_add(1, Ordering::SeqCst);
    }
    let reason = match reply.status {
        200 => "OK",
        402 => "Payment Required",
        429 => "Too Many Requests",
        _ => "Error",
    };
    let mut text = format!("HTTP/1.1 {} {reason}\r\n", reply.status);
    for (name, value) in &reply.headers {
        text.push_str(&format!("{name}: {value}\r\n"));
    }
    text.push_str(&format!("Content-Length: {}\r\nConnection: close\r\n\r\n{}", reply.body.len(), reply.body));
    let written = stream.write_all(text.as_bytes()).await;
    counters.in_flight.fetch_sub(1, Ordering::SeqCst);
    let call = ProviderCall { arrived, ended: Instant::now(), status: reply.status, path };
    counters.calls.lock().unwrap_or_else(PoisonError::into_inner).push(call);
    written?;
    stream.shutdown().await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tokens_come_from_the_query() {
        assert_eq!(tokens_asked(b"GET /v1/chat?tokens=250 HTTP/1.1\r\nHost: x\r\n\r\n"), 250);
        assert_eq!(tokens_asked(b"GET /job/3?a=1&tokens=7 HTTP/1.1\r\n\r\n"), 7);
        assert_eq!(tokens_asked(b"GET / HTTP/1.1\r\n\r\n"), 0);
        assert_eq!(tokens_asked(b"\xff\xff"), 0);
    }
}
