//! The provider role: a mock rate-limited API on loopback, in its own process.
//!
//! `GET /job/<id>` is served after the job's service time (see [`service_ms`]) while fewer than
//! `capacity` calls are being served and the requests-per-window budget (if any) allows it;
//! otherwise it answers `429 Too Many Requests` at once, with a `Retry-After` unless configured
//! without one (as nginx's `limit_conn` and many gateways answer). The capacity may change after a
//! number of calls served (phases). The capacity is hidden from wavegate: only the oracle strategy
//! reads the `X-Capacity` header every answer carries. Every request is recorded (start, end,
//! status) and written out when the runner says `DUMP path=FILE` on stdin; the process ends when
//! its stdin closes.

use std::collections::VecDeque;
use std::io::{BufRead, Write};
use std::process::ExitCode;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};

use wavegate_testkit::{
    Answer, AnthropicBucket, AnthropicLimits, BucketLimits, HeaderStyle, MockSseConfig, OpenAiBucket, ProviderLimits,
    SseStyle, WindowCounter,
};

use crate::protocol::{field, now_us, service_ms};
use crate::scenario::Bucket;

/// The provider's settings, read from the environment the runner sets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ProviderConfig {
    /// Calls served at once: `(served, capacity)` phases, from the call number `served` on;
    /// empty for no cap. The first phase starts at 0.
    pub(crate) capacity: Vec<(u64, usize)>,
    /// At most this many calls admitted in any window of `window_s` seconds.
    pub(crate) rpm: Option<u32>,
    /// The rate window, in seconds (60: requests per minute).
    pub(crate) window_s: u64,
    pub(crate) service_ms: (u64, u64),
    /// The `Retry-After` of a capacity 429, in seconds; `None`: a plain 429 (and a rate 429
    /// without one either).
    pub(crate) retry_after_s: Option<u32>,
    /// Announce the budgets in these headers: `rpm` and `tpm` are then fixed windows of
    /// `window_s` from the first call ([`WindowCounter`]), told on every answer.
    pub(crate) headers: Option<HeaderStyle>,
    /// Tokens per window (with `headers`); a call reserves the `tokens=N` of its query.
    pub(crate) tpm: Option<u32>,
    /// OpenAI's (or Anthropic's) buckets instead of everything above, and the fleet's
    /// concurrency limit (for the silences only: a gap while that many are served is none); a
    /// call is charged the `tokens=` (prompt) and `max_tokens=` of its query, and generates
    /// [`Bucket::output_of`] its job.
    pub(crate) bucket: Option<(Bucket, u32)>,
}

impl ProviderConfig {
    /// The environment variables that carry this configuration to the provider process.
    pub(crate) fn to_env(&self) -> Vec<(&'static str, String)> {
        let phases = self.capacity.iter().map(|(from, cap)| format!("{from}:{cap}")).collect::<Vec<_>>().join(",");
        vec![
            ("PROVIDER_CAPACITY", phases),
            ("PROVIDER_RPM", self.rpm.map_or(String::new(), |r| r.to_string())),
            ("PROVIDER_WINDOW_S", self.window_s.to_string()),
            ("PROVIDER_SERVICE_MS", format!("{}-{}", self.service_ms.0, self.service_ms.1)),
            ("PROVIDER_RETRY_AFTER", self.retry_after_s.map_or(String::new(), |r| r.to_string())),
            ("PROVIDER_HEADERS", self.headers.map_or(String::new(), |h| h.as_str().to_string())),
            ("PROVIDER_TPM", self.tpm.map_or(String::new(), |t| t.to_string())),
            ("PROVIDER_BUCKET", self.bucket.map_or(String::new(), |(b, busy)| format!("{busy};{}", b.to_field()))),
        ]
    }

    fn from_env() -> Result<Self, String> {
        Self::from_vars(|name| std::env::var(name).ok())
    }

    /// Reads the configuration through `get` (the environment, or a table in tests).
    fn from_vars(get: impl Fn(&str) -> Option<String>) -> Result<Self, String> {
        let var = |name: &str| get(name).ok_or_else(|| format!("the provider needs {name}"));
        let optional = |name: &str| -> Result<Option<u64>, String> {
            let value = var(name)?;
            if value.is_empty() { Ok(None) } else { value.parse().map(Some).map_err(|_| format!("{name}={value:?}")) }
        };
        let service = var("PROVIDER_SERVICE_MS")?;
        let (min, max) = service.split_once('-').ok_or_else(|| format!("PROVIDER_SERVICE_MS={service:?}"))?;
        let parse = |v: &str| v.parse::<u64>().map_err(|_| format!("PROVIDER_SERVICE_MS={service:?}"));
        let phases = var("PROVIDER_CAPACITY")?;
        let capacity = phases
            .split(',')
            .filter(|p| !p.is_empty())
            .map(|phase| {
                let (from, cap) = phase.split_once(':').ok_or_else(|| format!("PROVIDER_CAPACITY={phases:?}"))?;
                Ok((
                    from.parse().map_err(|_| format!("PROVIDER_CAPACITY={phases:?}"))?,
                    cap.parse().map_err(|_| format!("PROVIDER_CAPACITY={phases:?}"))?,
                ))
            })
            .collect::<Result<Vec<(u64, usize)>, String>>()?;
        Ok(Self {
            capacity,
            rpm: optional("PROVIDER_RPM")?.map(|r| r as u32),
            window_s: optional("PROVIDER_WINDOW_S")?.unwrap_or(60),
            service_ms: (parse(min)?, parse(max)?),
            retry_after_s: optional("PROVIDER_RETRY_AFTER")?.map(|r| r as u32),
            headers: match get("PROVIDER_HEADERS").unwrap_or_default().as_str() {
                "" => None,
                name => Some(HeaderStyle::parse(name).ok_or_else(|| format!("PROVIDER_HEADERS={name:?}"))?),
            },
            tpm: get("PROVIDER_TPM")
                .filter(|v| !v.is_empty())
                .map(|v| v.parse().map_err(|_| format!("PROVIDER_TPM={v:?}")))
                .transpose()?,
            bucket: match get("PROVIDER_BUCKET").unwrap_or_default().as_str() {
                "" => None,
                text => {
                    let bad = || format!("PROVIDER_BUCKET={text:?}");
                    let (busy, bucket) = text.split_once(';').ok_or_else(bad)?;
                    Some((Bucket::parse(bucket).ok_or_else(bad)?, busy.parse().map_err(|_| bad())?))
                }
            },
        })
    }

    /// The capacity once `served` calls have been admitted.
    pub(crate) fn capacity_at(&self, served: u64) -> Option<usize> {
        crate::scenario::phase_at(&self.capacity, served)
    }
}

/// One request as the provider saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Request {
    /// When its head had been read (µs since the epoch).
    pub(crate) start: u64,
    /// When its answer had been written.
    pub(crate) end: u64,
    /// 200 or 429 (or 400 for a request that was not `GET /job/<id>`).
    pub(crate) status: u16,
}

impl Request {
    /// Parses a line of the dump file: `start end status`.
    pub(crate) fn parse(line: &str) -> Option<Self> {
        let mut parts = line.split_whitespace().map(str::parse::<u64>);
        let (start, end, status) = (parts.next()?.ok()?, parts.next()?.ok()?, parts.next()?.ok()?);
        Some(Self { start, end, status: u16::try_from(status).ok()? })
    }
}

/// What the provider keeps between requests.
#[derive(Debug, Default)]
struct State {
    /// Calls being served now (a 429 is answered at once and does not count).
    serving: usize,
    /// Calls admitted so far (for the capacity phases).
    admitted: u64,
    /// Start times (µs) of the calls admitted in the last window, for the rate budget.
    window: VecDeque<u64>,
    /// The announced budgets' fixed windows (with `headers`), per API key (the `key=` of the
    /// query; none: one key).
    windows: std::collections::HashMap<String, WindowCounter>,
    /// OpenAI's buckets (with `bucket`), one key.
    bucket: Option<OpenAiBucket>,
    /// Anthropic's buckets (with a `bucket` whose `otpm` is set), one key.
    anthropic: Option<AnthropicBucket>,
    /// Streams whose client hung up before their end.
    cut: u64,
    /// Calls queued at the provider (`queue=1`, the Anthropic oracle's), by ticket, in
    /// arrival order; the last ticket given.
    queue: VecDeque<u64>,
    tickets: u64,
    records: Vec<Request>,
}

/// Why a call was refused, and the `Retry-After` to send (seconds), if any.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Refusal {
    retry_after_s: Option<u64>,
}

impl State {
    /// Admits a call at `now` or refuses it.
    fn admit(&mut self, config: &ProviderConfig, now: u64) -> Result<(), Refusal> {
        if config.capacity_at(self.admitted).is_some_and(|capacity| self.serving >= capacity) {
            return Err(Refusal { retry_after_s: config.retry_after_s.map(u64::from) });
        }
        if let Some(rpm) = config.rpm {
            let window_us = config.window_s * 1_000_000;
            while self.window.front().is_some_and(|&t| t + window_us <= now) {
                self.window.pop_front();
            }
            if self.window.len() >= rpm as usize {
                let oldest = self.window.front().copied().unwrap_or(now);
                let wait = (oldest + window_us - now).div_ceil(1_000_000).max(1);
                return Err(Refusal { retry_after_s: config.retry_after_s.map(|_| wait) });
            }
            self.window.push_back(now);
        }
        self.serving += 1;
        self.admitted += 1;
        Ok(())
    }

    /// With announced budgets: admits or refuses a call reserving `tokens` by the provider's
    /// windows (after the capacity), and says the headers and body to answer with.
    fn announce(&mut self, config: &ProviderConfig, style: HeaderStyle, tokens: u64, key: &str) -> Answer {
        if config.capacity_at(self.admitted).is_some_and(|capacity| self.serving >= capacity) {
            return Answer { status: 429, headers: Vec::new(), body: String::new() };
        }
        let limits = ProviderLimits {
            style,
            requests: config.rpm.map(u64::from),
            tokens: config.tpm.map(u64::from),
            window: Duration::from_secs(config.window_s),
            quota_exhausted: false,
        };
        let answer =
            self.windows.entry(key.to_string()).or_default().answer(&limits, std::time::Instant::now(), tokens);
        if answer.status == 200 {
            self.serving += 1;
            self.admitted += 1;
        }
        answer
    }

    /// The `X-Capacity` header line: the capacity now, or nothing when there is no cap here.
    fn capacity(&self, config: &ProviderConfig) -> String {
        config.capacity_at(self.admitted).map_or(String::new(), |c| format!("X-Capacity: {c}\r\n"))
    }
}

type Shared = Arc<Mutex<State>>;

fn lock(state: &Shared) -> std::sync::MutexGuard<'_, State> {
    state.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Runs the provider until its stdin closes.
pub(crate) fn main() -> ExitCode {
    let config = match ProviderConfig::from_env() {
        Ok(config) => config,
        Err(error) => {
            eprintln!("provider: {error}");
            return ExitCode::FAILURE;
        }
    };
    let state: Shared = Arc::default();
    let listener = match std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| {
        l.set_nonblocking(true)?;
        Ok(l)
    }) {
        Ok(listener) => listener,
        Err(error) => {
            eprintln!("provider: cannot listen on 127.0.0.1: {error}");
            return ExitCode::FAILURE;
        }
    };
    let addr = listener.local_addr().map(|a| a.to_string()).unwrap_or_default();
    let served = state.clone();
    let server = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
        runtime.block_on(async move {
            let listener = TcpListener::from_std(listener).expect("a tokio listener");
            let config = Arc::new(config);
            loop {
                let Ok((stream, _)) = listener.accept().await else { continue };
                let (config, state) = (config.clone(), served.clone());
                tokio::spawn(async move { answer(stream, &config, &state).await });
            }
        });
    });
    println!("LISTENING addr={addr}");
    for line in std::io::stdin().lock().lines().map_while(Result::ok) {
        if let Some(path) = line.strip_prefix("DUMP").and_then(|rest| field(rest, "path")) {
            match dump(&state, path) {
                Ok(n) => println!("DUMPED n={n}{}", bucket_fields(&state)),
                Err(error) => println!("DUMPED n=0 error={}", error.to_string().replace(' ', "_")),
            }
        }
    }
    drop(server); // detached: the process ends here
    ExitCode::SUCCESS
}

/// What the buckets saw, for the `DUMPED` line: OpenAI's longest silence with room (ms), the
/// tokens charged (Anthropic: input, and output apart), the most calls served (streams open)
/// at once, the refusals by the cap and by the buckets, the streams cut (empty without a
/// bucket).
fn bucket_fields(state: &Shared) -> String {
    let state = lock(state);
    let cut = state.cut;
    if let Some(b) = &state.anthropic {
        return format!(
            " silence_ms={} charged={} output_charged={} max_open={} refused_cap=0 refused_budget={} cut={cut}",
            b.longest_silence().as_millis(),
            b.input_charged(),
            b.output_charged(),
            b.max_in_flight(),
            b.refused()
        );
    }
    state.bucket.as_ref().map_or(String::new(), |b| {
        format!(
            " silence_ms={} charged={} max_open={} refused_cap={} refused_budget={} cut={cut}",
            b.longest_silence().as_millis(),
            b.charged(),
            b.max_in_flight(),
            b.refused_by_cap(),
            b.refused_by_budget()
        )
    })
}

fn dump(state: &Shared, path: &str) -> std::io::Result<usize> {
    let records = lock(state).records.clone();
    let mut out = std::io::BufWriter::new(std::fs::File::create(path)?);
    for r in &records {
        writeln!(out, "{} {} {}", r.start, r.end, r.status)?;
    }
    out.flush()?;
    Ok(records.len())
}

async fn answer(mut stream: TcpStream, config: &ProviderConfig, state: &Shared) {
    let Ok(head) = wavegate_testkit::read_request_head(&mut stream).await else { return };
    let start = now_us();
    let job = std::str::from_utf8(&head)
        .ok()
        .and_then(|h| h.strip_prefix("GET /job/"))
        .and_then(|rest| rest.split([' ', '?']).next())
        .and_then(|id| id.parse::<u64>().ok());
    let Some(job) = job else {
        let _ = stream.write_all(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n").await;
        lock(state).records.push(Request { start, end: now_us(), status: 400 });
        return;
    };
    if let Some((bucket, busy_at)) = config.bucket {
        let (prompt, max_tokens) = (tokens_of(&head), query_value(&head, "max_tokens").and_then(|n| n.parse().ok()));
        let max_tokens = max_tokens.unwrap_or(0);
        let limits = AnthropicLimits {
            requests_per_minute: u64::from(bucket.rpm),
            input_tokens_per_minute: u64::from(bucket.tpm),
            output_tokens_per_minute: u64::from(bucket.otpm),
        };
        if bucket.is_anthropic() && query_value(&head, "queue").as_deref() == Some("1") {
            // The oracle's calls wait here, in arrival order, until the buckets hold them.
            let ticket = {
                let mut state = lock(state);
                state.tickets += 1;
                let ticket = state.tickets;
                state.queue.push_back(ticket);
                ticket
            };
            loop {
                {
                    let mut state = lock(state);
                    let now = std::time::Instant::now();
                    if state.queue.front() == Some(&ticket)
                        && state
                            .anthropic
                            .get_or_insert_with(|| AnthropicBucket::new(limits))
                            .holds(now, prompt, max_tokens)
                    {
                        state.queue.pop_front();
                        break;
                    }
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        }
        let answer = {
            let mut state = lock(state);
            let now = std::time::Instant::now();
            if bucket.is_anthropic() {
                state.anthropic.get_or_insert_with(|| AnthropicBucket::new(limits)).answer(now, prompt, max_tokens)
            } else {
                let limits = BucketLimits {
                    requests_per_minute: u64::from(bucket.rpm),
                    tokens_per_minute: u64::from(bucket.tpm),
                    concurrency: (bucket.cap > 0).then_some(bucket.cap as usize),
                    errors_per_mille: bucket.errors_per_mille,
                    seed: 42,
                    busy_at: Some(busy_at as usize),
                };
                state.bucket.get_or_insert_with(|| OpenAiBucket::new(limits)).answer(now, prompt, max_tokens)
            }
        };
        let output = bucket.output_of(job).min(max_tokens);
        if answer.status != 200 {
            reply_with(&mut stream, &answer).await;
        } else if bucket.stream {
            let service = Duration::from_millis(service_ms(job, config.service_ms));
            if stream_answer(&mut stream, &answer, service, prompt, output).await.is_err() {
                lock(state).cut += 1;
            }
        } else {
            tokio::time::sleep(Duration::from_millis(service_ms(job, config.service_ms))).await;
            let body = if bucket.is_anthropic() {
                format!(
                    r#"{{"type":"message","role":"assistant","content":[],"usage":{{"input_tokens":{prompt},"output_tokens":{output}}}}}"#
                )
            } else {
                answer.body.clone()
            };
            reply_with(&mut stream, &Answer { body, ..answer.clone() }).await;
        }
        let mut state = lock(state);
        let now = std::time::Instant::now();
        if answer.status == 200 {
            if let Some(anthropic) = state.anthropic.as_mut() {
                anthropic.finished(now, max_tokens, output);
            } else if let Some(openai) = state.bucket.as_mut() {
                openai.finished(now);
            }
        }
        state.records.push(Request { start, end: now_us(), status: answer.status });
        return;
    }
    if let Some(style) = config.headers {
        let (tokens, key) = (tokens_of(&head), query_value(&head, "key").unwrap_or_default());
        let answer = lock(state).announce(config, style, tokens, &key);
        if answer.status == 200 {
            tokio::time::sleep(Duration::from_millis(service_ms(job, config.service_ms))).await;
        }
        let reason = if answer.status == 200 { "OK" } else { "Too Many Requests" };
        let mut reply = format!("HTTP/1.1 {} {reason}\r\n", answer.status);
        for (name, value) in &answer.headers {
            reply.push_str(&format!("{name}: {value}\r\n"));
        }
        reply.push_str(&format!("Content-Length: {}\r\nConnection: close\r\n\r\n{}", answer.body.len(), answer.body));
        let _ = stream.write_all(reply.as_bytes()).await;
        {
            let mut state = lock(state);
            if answer.status == 200 {
                state.serving -= 1;
            }
            state.records.push(Request { start, end: now_us(), status: answer.status });
        }
        let _ = stream.shutdown().await;
        return;
    }
    let (admitted, capacity) = {
        let mut state = lock(state);
        let admitted = state.admit(config, start);
        (admitted, state.capacity(config))
    };
    let status = match admitted {
        Ok(()) => {
            tokio::time::sleep(Duration::from_millis(service_ms(job, config.service_ms))).await;
            let reply = format!("HTTP/1.1 200 OK\r\n{capacity}Content-Length: 2\r\nConnection: close\r\n\r\nok");
            let _ = stream.write_all(reply.as_bytes()).await;
            lock(state).serving -= 1;
            200
        }
        Err(refusal) => {
            let retry_after = refusal.retry_after_s.map_or(String::new(), |s| format!("Retry-After: {s}\r\n"));
            let reply = format!(
                "HTTP/1.1 429 Too Many Requests\r\n{retry_after}{capacity}Content-Length: 0\r\n\
                 Connection: close\r\n\r\n"
            );
            let _ = stream.write_all(reply.as_bytes()).await;
            429
        }
    };
    lock(state).records.push(Request { start, end: now_us(), status });
    let _ = stream.shutdown().await;
}

/// Writes `answer` (status, headers, body) and closes the connection.
async fn reply_with(stream: &mut TcpStream, answer: &Answer) {
    let reason = match answer.status {
        200 => "OK",
        429 => "Too Many Requests",
        _ => "Internal Server Error",
    };
    let mut reply = format!("HTTP/1.1 {} {reason}\r\n", answer.status);
    for (name, value) in &answer.headers {
        reply.push_str(&format!("{name}: {value}\r\n"));
    }
    reply.push_str(&format!("Content-Length: {}\r\nConnection: close\r\n\r\n{}", answer.body.len(), answer.body));
    let _ = stream.write_all(reply.as_bytes()).await;
    let _ = stream.shutdown().await;
}

/// Streams an admitted answer: its head with `answer`'s headers, then OpenAI's chat-completion
/// chunks spread over `service` (one every 100 ms or so), the last with the usage
/// (`prompt_tokens`, `completion_tokens`, as with `stream_options.include_usage`), `[DONE]`.
/// An error: the client hung up before the end.
async fn stream_answer(
    stream: &mut TcpStream,
    answer: &Answer,
    service: Duration,
    prompt: u64,
    output: u64,
) -> std::io::Result<()> {
    let mut head = String::from("HTTP/1.1 200 OK\r\n");
    for (name, value) in &answer.headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("Content-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n");
    stream.write_all(head.as_bytes()).await?;
    stream.flush().await?;
    let chunks = (service.as_millis() / 100).max(1) as usize;
    let config = MockSseConfig {
        chunks,
        every: service / chunks as u32,
        style: SseStyle::OpenAi,
        prompt_tokens: prompt,
        completion_tokens: output,
        reject_first: 0,
    };
    let (content, end) = wavegate_testkit::sse_events(&config);
    for event in content {
        tokio::time::sleep(config.every).await;
        stream.write_all(&wavegate_testkit::http_chunk(&event)).await?;
        stream.flush().await?;
    }
    for event in end {
        stream.write_all(&wavegate_testkit::http_chunk(&event)).await?;
    }
    stream.write_all(b"0\r\n\r\n").await?;
    stream.flush().await?;
    stream.shutdown().await
}

/// The value of `name=` in a request line's query.
fn query_value(head: &[u8], name: &str) -> Option<String> {
    let line = String::from_utf8_lossy(head.split(|b| *b == b'\r').next().unwrap_or_default()).into_owned();
    let query = line.split_whitespace().nth(1)?.split_once('?')?.1.to_string();
    query.split('&').find_map(|pair| pair.strip_prefix(name)?.strip_prefix('=').map(str::to_string))
}

/// The `tokens=N` of a request line's query (0 without one).
fn tokens_of(head: &[u8]) -> u64 {
    query_value(head, "tokens").and_then(|n| n.parse().ok()).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(capacity: Option<usize>, rpm: Option<u32>) -> ProviderConfig {
        ProviderConfig {
            capacity: capacity.map(|c| vec![(0, c)]).unwrap_or_default(),
            rpm,
            window_s: 60,
            service_ms: (1, 1),
            retry_after_s: Some(1),
            headers: None,
            tpm: None,
            bucket: None,
        }
    }

    #[test]
    fn announced_budgets_are_windows_told_in_headers() {
        let config = ProviderConfig { headers: Some(HeaderStyle::OpenAi), tpm: Some(300), ..config(None, Some(5)) };
        let mut state = State::default();
        let first = state.announce(&config, HeaderStyle::OpenAi, 200, "");
        assert_eq!(first.status, 200);
        assert!(first.headers.contains(&("x-ratelimit-remaining-tokens".to_string(), "100".to_string())));
        assert_eq!(state.announce(&config, HeaderStyle::OpenAi, 200, "").status, 429, "tokens spent");
        assert_eq!(state.announce(&config, HeaderStyle::OpenAi, 200, "k2").status, 200, "each key its own windows");
        assert_eq!(state.serving, 2);
        assert_eq!(
            query_value(b"GET /job/3?tokens=200&key=provider-1 HTTP/1.1\r\n\r\n", "key").as_deref(),
            Some("provider-1")
        );
        assert_eq!(tokens_of(b"GET /job/3?tokens=200 HTTP/1.1\r\n\r\n"), 200);
        assert_eq!(tokens_of(b"GET /job/3 HTTP/1.1\r\n\r\n"), 0);
        let env = config.to_env();
        let get = |name: &str| env.iter().find(|(key, _)| *key == name).map(|(_, value)| value.clone());
        assert_eq!(ProviderConfig::from_vars(get), Ok(config));
    }

    const REFUSED: Result<(), Refusal> = Err(Refusal { retry_after_s: Some(1) });

    #[test]
    fn the_capacity_is_hidden_but_enforced() {
        let (config, mut state) = (config(Some(2), None), State::default());
        assert_eq!(state.admit(&config, 0), Ok(()));
        assert_eq!(state.admit(&config, 0), Ok(()));
        assert_eq!(state.admit(&config, 0), REFUSED);
        state.serving -= 1;
        assert_eq!(state.admit(&config, 0), Ok(()));
    }

    #[test]
    fn the_capacity_moves_with_the_calls_served_and_a_plain_429_has_no_retry_after() {
        let config = ProviderConfig { capacity: vec![(0, 1), (2, 3)], retry_after_s: None, ..config(None, None) };
        let mut state = State::default();
        assert_eq!(state.admit(&config, 0), Ok(()));
        assert_eq!(state.admit(&config, 0), Err(Refusal { retry_after_s: None }));
        state.serving = 0;
        assert_eq!(state.admit(&config, 0), Ok(()));
        assert_eq!(state.capacity(&config), "X-Capacity: 3\r\n");
        assert_eq!(state.admit(&config, 0), Ok(()));
        assert_eq!(state.admit(&config, 0), Ok(()));
        assert_eq!(state.admit(&config, 0), Err(Refusal { retry_after_s: None }));
    }

    #[test]
    fn the_rpm_budget_is_a_sliding_window() {
        let (config, mut state) = (config(None, Some(2)), State::default());
        assert_eq!(state.admit(&config, 0), Ok(()));
        assert_eq!(state.admit(&config, 10_000_000), Ok(()));
        // The third call in the minute waits until the first leaves the window (60 s after it).
        assert_eq!(state.admit(&config, 30_000_000), Err(Refusal { retry_after_s: Some(30) }));
        assert_eq!(state.admit(&config, 60_000_000), Ok(()));
        let short = ProviderConfig { window_s: 10, ..config };
        let mut state = State::default();
        assert_eq!(state.admit(&short, 0), Ok(()));
        assert_eq!(state.admit(&short, 0), Ok(()));
        assert_eq!(state.admit(&short, 4_000_000), Err(Refusal { retry_after_s: Some(6) }));
    }

    #[test]
    fn dump_lines_round_trip() {
        assert_eq!(Request::parse("10 20 429"), Some(Request { start: 10, end: 20, status: 429 }));
        assert_eq!(Request::parse("10 20"), None);
    }

    #[test]
    fn the_configuration_round_trips_through_the_environment() {
        let config = ProviderConfig {
            capacity: vec![(0, 8), (100, 4)],
            bucket: Some((
                crate::scenario::SCENARIOS.iter().find_map(|s| s.bucket.filter(|b| b.stream)).expect("a streamed one"),
                32,
            )),
            ..config(None, None)
        };
        let env = config.to_env();
        assert!(env.contains(&("PROVIDER_CAPACITY", "0:8,100:4".to_string())));
        assert!(env.contains(&("PROVIDER_RPM", String::new())));
        let get = |name: &str| env.iter().find(|(key, _)| *key == name).map(|(_, value)| value.clone());
        assert_eq!(ProviderConfig::from_vars(get), Ok(config));
    }
}
