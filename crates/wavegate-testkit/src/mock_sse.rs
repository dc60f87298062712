//! A mock LLM provider on loopback that streams its answers as server-sent events, slowly, and
//! counts the streams it has open at once.
//!
//! The referee of streamed calls: a stream is open from its request's head until its last byte
//! is written, or until a write fails because the client hung up. Each answer is `200` with
//! `Content-Type: text/event-stream` in chunked transfer encoding: [`MockSseConfig::chunks`]
//! content events, one every [`MockSseConfig::every`], then the usage (OpenAI's
//! `include_usage` chunk or Anthropic's `message_start` / `message_delta`, [`SseStyle`]) and
//! the end (`data: [DONE]`, `message_stop`). The first [`MockSseConfig::reject_first`] calls
//! get `429` with `Retry-After: 0` instead.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};

use crate::mock_upstream::read_request_head;
use crate::server_thread::ServerThread;

/// Which provider's events the mock sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SseStyle {
    /// OpenAI's Chat Completions with `stream_options.include_usage`: a last chunk with `usage`.
    OpenAi,
    /// Anthropic's Messages: `message_start` with the input usage, `message_delta` with the
    /// output usage.
    Anthropic,
}

/// How the mock streams.
#[derive(Debug, Clone)]
pub struct MockSseConfig {
    /// Content events per answer.
    pub chunks: usize,
    /// The pause before each content event.
    pub every: Duration,
    /// The events' format.
    pub style: SseStyle,
    /// The input tokens the usage reports.
    pub prompt_tokens: u64,
    /// The output tokens the usage reports.
    pub completion_tokens: u64,
    /// The first calls answered `429` (`Retry-After: 0`) instead of a stream.
    pub reject_first: usize,
}

impl Default for MockSseConfig {
    fn default() -> Self {
        Self {
            chunks: 20,
            every: Duration::from_millis(50),
            style: SseStyle::OpenAi,
            prompt_tokens: 12,
            completion_tokens: 20,
            reject_first: 0,
        }
    }
}

#[derive(Debug, Default)]
struct Counters {
    calls: AtomicU64,
    open: AtomicUsize,
    max_open: AtomicUsize,
    completed: AtomicU64,
    hung_up: AtomicU64,
    rejected: AtomicU64,
}

/// A running SSE mock; stops on drop.
#[derive(Debug)]
pub struct MockSse {
    server: ServerThread,
    counters: Arc<Counters>,
}

impl MockSse {
    /// Starts serving on a free port of 127.0.0.1, on a thread of its own.
    pub fn start(config: MockSseConfig) -> io::Result<Self> {
        let counters = Arc::new(Counters::default());
        let served = counters.clone();
        let server = ServerThread::start("mock-sse", move |listener| serve(listener, Arc::new(config), served))?;
        Ok(Self { server, counters })
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.server.addr()
    }

    /// Every call that arrived.
    pub fn calls(&self) -> u64 {
        self.counters.calls.load(Ordering::SeqCst)
    }

    /// Streams open now.
    pub fn open(&self) -> usize {
        self.counters.open.load(Ordering::SeqCst)
    }

    /// The most streams ever open at once.
    pub fn max_open(&self) -> usize {
        self.counters.max_open.load(Ordering::SeqCst)
    }

    /// Streams written to their end.
    pub fn completed(&self) -> u64 {
        self.counters.completed.load(Ordering::SeqCst)
    }

    /// Streams whose client hung up before their end.
    pub fn hung_up(&self) -> u64 {
        self.counters.hung_up.load(Ordering::SeqCst)
    }

    /// Calls answered 429.
    pub fn rejected(&self) -> u64 {
        self.counters.rejected.load(Ordering::SeqCst)
    }
}

async fn serve(listener: TcpListener, config: Arc<MockSseConfig>, counters: Arc<Counters>) {
    loop {
        let Ok((stream, _)) = listener.accept().await else { continue };
        let (config, counters) = (config.clone(), counters.clone());
        tokio::spawn(async move {
            let _ = answer(stream, &config, &counters).await;
        });
    }
}

/// One chunk of chunked transfer encoding (`{len:x}\r\n{data}\r\n`); the end of a body is
/// `0\r\n\r\n`.
pub fn http_chunk(data: &str) -> Vec<u8> {
    format!("{:x}\r\n{data}\r\n", data.len()).into_bytes()
}

/// The server-sent events of one answer as the mock writes them: the content events (each
/// written after a pause of [`MockSseConfig::every`]), then the usage and the end, which follow
/// the last content event at once.
pub fn sse_events(config: &MockSseConfig) -> (Vec<String>, Vec<String>) {
    let (prompt, completion) = (config.prompt_tokens, config.completion_tokens);
    match config.style {
        SseStyle::OpenAi => {
            let content = (0..config.chunks)
                .map(|i| {
                    format!("data: {{\"id\":\"c\",\"choices\":[{{\"delta\":{{\"content\":\"w{i} \"}}}}],\"usage\":null}}\n\n")
                })
                .collect();
            let usage = format!(
                "data: {{\"id\":\"c\",\"choices\":[],\"usage\":{{\"prompt_tokens\":{prompt},\"completion_tokens\":{completion},\"total_tokens\":{}}}}}\n\n",
                prompt + completion
            );
            (content, vec![usage, "data: [DONE]\n\n".to_string()])
        }
        SseStyle::Anthropic => {
            let start = format!(
                "event: message_start\ndata: {{\"type\":\"message_start\",\"message\":{{\"usage\":{{\"input_tokens\":{prompt},\"output_tokens\":1}}}}}}\n\n"
            );
            let mut content = vec![start];
            content.extend((0..config.chunks).map(|i| {
                format!("event: content_block_delta\ndata: {{\"type\":\"content_block_delta\",\"delta\":{{\"type\":\"text_delta\",\"text\":\"w{i} \"}}}}\n\n")
            }));
            let delta = format!(
                "event: message_delta\ndata: {{\"type\":\"message_delta\",\"delta\":{{\"stop_reason\":\"end_turn\"}},\"usage\":{{\"output_tokens\":{completion}}}}}\n\n"
            );
            (content, vec![delta, "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n".to_string()])
        }
    }
}

async fn answer(mut stream: TcpStream, config: &MockSseConfig, counters: &Counters) -> io::Result<()> {
    read_request_head(&mut stream).await?;
    let index = counters.calls.fetch_add(1, Ordering::SeqCst);
    if (index as usize) < config.reject_first {
        counters.rejected.fetch_add(1, Ordering::SeqCst);
        let reply =
            "HTTP/1.1 429 Too Many Requests\r\nRetry-After: 0\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
        stream.write_all(reply.as_bytes()).await?;
        return stream.shutdown().await;
    }
    let now = counters.open.fetch_add(1, Ordering::SeqCst) + 1;
    counters.max_open.fetch_max(now, Ordering::SeqCst);
    let written = write_stream(&mut stream, config).await;
    counters.open.fetch_sub(1, Ordering::SeqCst);
    match written {
        Ok(()) => {
            counters.completed.fetch_add(1, Ordering::SeqCst);
            stream.shutdown().await
        }
        Err(error) => {
            counters.hung_up.fetch_add(1, Ordering::SeqCst);
            Err(error)
        }
    }
}

async fn write_stream(stream: &mut TcpStream, config: &MockSseConfig) -> io::Result<()> {
    let head = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n";
    stream.write_all(head.as_bytes()).await?;
    let (content, end) = sse_events(config);
    for event in content {
        tokio::time::sleep(config.every).await;
        stream.write_all(&http_chunk(&event)).await?;
        stream.flush().await?;
    }
    for event in end {
        stream.write_all(&http_chunk(&event)).await?;
    }
    stream.write_all(b"0\r\n\r\n").await?;
    stream.flush().await
}
