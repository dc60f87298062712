//! The worker role: one process of the fleet, running one strategy with `CALLERS` concurrent
//! callers. It takes jobs from the runner (`JOB id=N` on stdin), reports each (`DONE ...` on
//! stdout), and ends after `END` once its callers are idle.
//!
//! A job's times: `start` when a caller takes it, `success_start` when the attempt that
//! succeeded was sent (after any permit or semaphore wait, backoff and failed attempts),
//! `end` when that attempt (or the last one) answered.

use std::cell::Cell;
use std::io::BufRead;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::rc::Rc;
use std::time::{Duration, SystemTime};

use futures_util::StreamExt;
use rand::Rng;
use tokio::sync::{Mutex, Semaphore, mpsc, oneshot};
use wavegate::PoolConfig;
use wavegate::{Mode, Outcome, ProviderSignals, Scheduler, SseUsage, TransportError};
use wavegate_testkit::{HttpReply, http_get};

use crate::oracle::{BucketOracle, Oracle};
use crate::protocol::{now_us, num};
use crate::scenario::Bucket;
use crate::strategy::{self, Kind, Strategy};

/// The upstream's name in wavegate (and so in Redis keys: `wavegate:{provider}:...`).
pub(crate) const UPSTREAM: &str = "provider";
/// How often the status poller reads `scheduler.status(..)`.
const POLL_EVERY: Duration = Duration::from_millis(50);
/// The longest one HTTP call may take.
const HTTP_TIMEOUT: Duration = Duration::from_secs(10);
/// The longest the Anthropic oracle's call may wait at the provider and be served.
const QUEUED_TIMEOUT: Duration = Duration::from_secs(300);
/// The oracle's attempts per job.
const ORACLE_ATTEMPTS: u32 = 50;

/// What the runner tells a worker through its environment.
#[derive(Debug, Clone)]
pub(crate) struct WorkerEnv {
    pub(crate) strategy: &'static str,
    pub(crate) provider: SocketAddr,
    pub(crate) redis_url: Option<String>,
    pub(crate) callers: usize,
    pub(crate) limit: u32,
    pub(crate) lease: Duration,
    /// Whether this worker polls the scheduler's status and prints it.
    pub(crate) poll_status: bool,
    /// This worker's place in the fleet, and the fleet's size (for the oracle's share).
    pub(crate) index: usize,
    pub(crate) processes: usize,
    /// What the oracle knows at the start: the provider's capacity (0: none) and its rate
    /// window (calls, seconds).
    pub(crate) oracle_capacity: usize,
    pub(crate) oracle_rate: Option<(u32, u64)>,
    /// Tokens each job reserves (sent in its query; wavegate's estimate), 0 for none.
    pub(crate) tokens: u64,
    /// API keys (more than one: wavegate pools them, one upstream per key).
    pub(crate) keys: u32,
    /// A requests-per-minute budget configured in wavegate (0: none).
    pub(crate) rpm: u32,
    /// OpenAI's buckets: each job's prompt and `max_tokens`, the oracle's truth, wavegate's
    /// configured budgets (replaces `tokens`).
    pub(crate) bucket: Option<Bucket>,
}

impl WorkerEnv {
    pub(crate) fn to_env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("WORKER_STRATEGY", self.strategy.to_string()),
            ("WORKER_PROVIDER", self.provider.to_string()),
            ("WORKER_REDIS_URL", self.redis_url.clone().unwrap_or_default()),
            ("WORKER_CALLERS", self.callers.to_string()),
            ("WORKER_LIMIT", self.limit.to_string()),
            ("WORKER_LEASE_MS", self.lease.as_millis().to_string()),
            ("WORKER_POLL_STATUS", u8::from(self.poll_status).to_string()),
            ("WORKER_INDEX", self.index.to_string()),
            ("WORKER_PROCESSES", self.processes.to_string()),
            ("WORKER_ORACLE_CAPACITY", self.oracle_capacity.to_string()),
            ("WORKER_ORACLE_RATE", self.oracle_rate.map_or(String::new(), |(calls, s)| format!("{calls}/{s}"))),
            ("WORKER_TOKENS", self.tokens.to_string()),
            ("WORKER_KEYS", self.keys.to_string()),
            ("WORKER_RPM", self.rpm.to_string()),
            ("WORKER_BUCKET", self.bucket.map_or(String::new(), |b| b.to_field())),
        ]
    }

    fn from_env() -> Result<Self, String> {
        let var = |name: &str| std::env::var(name).map_err(|_| format!("the worker needs {name}"));
        let parsed = |name: &str| -> Result<u64, String> {
            let value = var(name)?;
            value.parse().map_err(|_| format!("{name}={value:?}"))
        };
        let name = var("WORKER_STRATEGY")?;
        let strategy = strategy::find(&name).ok_or_else(|| format!("unknown strategy {name:?}"))?.name;
        let redis_url = var("WORKER_REDIS_URL")?;
        Ok(Self {
            strategy,
            provider: var("WORKER_PROVIDER")?.parse().map_err(|_| "WORKER_PROVIDER".to_string())?,
            redis_url: (!redis_url.is_empty()).then_some(redis_url),
            callers: parsed("WORKER_CALLERS")? as usize,
            limit: parsed("WORKER_LIMIT")? as u32,
            lease: Duration::from_millis(parsed("WORKER_LEASE_MS")?),
            poll_status: parsed("WORKER_POLL_STATUS")? == 1,
            index: parsed("WORKER_INDEX")? as usize,
            processes: parsed("WORKER_PROCESSES")?.max(1) as usize,
            oracle_capacity: parsed("WORKER_ORACLE_CAPACITY")? as usize,
            tokens: parsed("WORKER_TOKENS")?,
            keys: parsed("WORKER_KEYS")?.max(1) as u32,
            rpm: parsed("WORKER_RPM")? as u32,
            bucket: match std::env::var("WORKER_BUCKET").unwrap_or_default().as_str() {
                "" => None,
                text => Some(Bucket::parse(text).ok_or_else(|| format!("WORKER_BUCKET={text:?}"))?),
            },
            oracle_rate: {
                let rate = var("WORKER_ORACLE_RATE")?;
                match rate.split_once('/') {
                    Some((calls, seconds)) => Some((
                        calls.parse().map_err(|_| format!("WORKER_ORACLE_RATE={rate:?}"))?,
                        seconds.parse().map_err(|_| format!("WORKER_ORACLE_RATE={rate:?}"))?,
                    )),
                    None => None,
                }
            },
        })
    }
}

/// How one job went.
#[derive(Debug, Default, Clone, Copy)]
struct JobLog {
    ok: bool,
    attempts: u32,
    rate_limited: u32,
    start: u64,
    success_start: u64,
    end: u64,
}

/// Runs the worker until `END` (or the end of stdin).
pub(crate) fn main() -> ExitCode {
    let env = match WorkerEnv::from_env() {
        Ok(env) => env,
        Err(error) => {
            eprintln!("worker: {error}");
            return ExitCode::FAILURE;
        }
    };
    let strategy = strategy::find(env.strategy).expect("checked in from_env");
    let (go_tx, go_rx) = oneshot::channel::<u64>();
    let (jobs_tx, jobs_rx) = mpsc::unbounded_channel::<u64>();
    std::thread::spawn(move || read_commands(go_tx, jobs_tx));
    let system = actix::System::new();
    let result = system.block_on(run(env, strategy, go_rx, jobs_rx));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("worker {}: {error}", std::process::id());
            ExitCode::FAILURE
        }
    }
}

/// Turns the runner's lines into the go signal and the job channel; `END` or the end of
/// stdin closes the channel.
fn read_commands(go: oneshot::Sender<u64>, jobs: mpsc::UnboundedSender<u64>) {
    let mut go = Some(go);
    for line in std::io::stdin().lock().lines().map_while(Result::ok) {
        if line.starts_with("GO") {
            if let Some(go) = go.take() {
                let _ = go.send(num(&line, "t0").unwrap_or_else(now_us));
            }
        } else if line.starts_with("JOB") {
            if let Some(id) = num(&line, "id")
                && jobs.send(id).is_err()
            {
                return;
            }
        } else if line.starts_with("END") {
            return;
        }
    }
}

/// The strategy's shared state in this process.
#[derive(Clone)]
enum Runner {
    Naive,
    Semaphore(Rc<Semaphore>),
    Wavegate(Scheduler),
    Oracle(Rc<Oracle>),
    BucketOracle(Rc<BucketOracle>),
}

async fn run(
    env: WorkerEnv,
    strategy: &'static Strategy,
    go: oneshot::Receiver<u64>,
    jobs: mpsc::UnboundedReceiver<u64>,
) -> Result<(), String> {
    let runner = match &strategy.kind {
        Kind::Naive { .. } => Runner::Naive,
        Kind::Semaphore { per_process, .. } => Runner::Semaphore(Rc::new(Semaphore::new(*per_process))),
        Kind::Oracle => match &env.bucket {
            Some(bucket) => Runner::BucketOracle(Rc::new(BucketOracle::new(&env, bucket))),
            None => Runner::Oracle(Rc::new(Oracle::new(&env))),
        },
        Kind::Wavegate { recovery } if env.keys > 1 => {
            // One upstream per key, pooled under the usual name.
            let mut builder = Scheduler::builder();
            let mut pool = PoolConfig::builder(UPSTREAM);
            for key in 0..env.keys {
                let name = member_name(key);
                let config = strategy::configure_named(&name, *recovery, env.limit, env.lease)
                    .build()
                    .map_err(|e| format!("config: {e}"))?;
                builder = builder.upstream(config);
                pool = pool.member(name, 1);
            }
            let url = env.redis_url.clone().ok_or("wavegate needs WORKER_REDIS_URL")?;
            let pool = pool.build().map_err(|e| format!("pool: {e}"))?;
            let scheduler = builder.pool(pool).redis(url).build().map_err(|e| e.to_string())?;
            wait_until_shared(&scheduler).await?;
            Runner::Wavegate(scheduler)
        }
        Kind::Wavegate { recovery } => {
            let mut config = strategy::configure(*recovery, env.limit, env.lease);
            if env.rpm > 0 {
                config = config.requests_per_minute(env.rpm, crate::scenario::Announced::configured_burst(env.rpm));
            }
            match env.bucket {
                Some(b) if b.is_anthropic() => {
                    if let Some((rpm, rpm_burst, itpm, itpm_burst)) = b.budgets {
                        // Input and output apart, as the guide says; the output's burst the
                        // same share of its bucket as the input's.
                        let otpm_burst =
                            u32::try_from(u64::from(b.otpm) * u64::from(itpm_burst) / u64::from(itpm.max(1)))
                                .unwrap_or(b.otpm);
                        config = config
                            .requests_per_minute(rpm, rpm_burst)
                            .input_tokens_per_minute(itpm, itpm_burst)
                            .output_tokens_per_minute(b.otpm, otpm_burst);
                    }
                }
                Some(b) => {
                    if let Some((rpm, rpm_burst, tpm, tpm_burst)) = b.budgets {
                        // The provider keeps prompt + max_tokens charged, as the guide says to
                        // declare.
                        config = config
                            .requests_per_minute(rpm, rpm_burst)
                            .tokens_per_minute(tpm, tpm_burst)
                            .keeps_estimate(true);
                    }
                }
                None => {}
            }
            let config = config.build().map_err(|e| format!("config: {e}"))?;
            let url = env.redis_url.clone().ok_or("wavegate needs WORKER_REDIS_URL")?;
            let scheduler = Scheduler::builder().upstream(config).redis(url).build().map_err(|e| e.to_string())?;
            wait_until_shared(&scheduler).await?;
            Runner::Wavegate(scheduler)
        }
    };
    println!("READY pid={}", std::process::id());
    go.await.map_err(|_| "no GO from the runner")?;

    let status_calls = Rc::new(Cell::new(0u64));
    let poller = match (&runner, env.poll_status) {
        (Runner::Wavegate(scheduler), true) => Some(actix::spawn(poll_status(scheduler.clone(), status_calls.clone()))),
        _ => None,
    };
    let jobs = Rc::new(Mutex::new(jobs));
    let settled = Rc::new(Settled::default());
    let mut callers = Vec::with_capacity(env.callers);
    for _ in 0..env.callers {
        let (jobs, runner, provider, tokens, bucket, settled) =
            (jobs.clone(), runner.clone(), env.provider, env.tokens, env.bucket, settled.clone());
        callers.push(actix::spawn(async move {
            loop {
                let next = jobs.lock().await.recv().await;
                let Some(id) = next else { break };
                // The estimate wavegate reserves, and what the query tells the provider.
                let (estimate, query) = match bucket {
                    Some(b) => {
                        (b.cost_of(id), format!("tokens={}&max_tokens={}", b.prompt_of(id), b.max_tokens_of(id)))
                    }
                    None if tokens > 0 => (tokens, format!("tokens={tokens}")),
                    None => (0, String::new()),
                };
                let log = run_job(&strategy.kind, &runner, provider, id, (estimate, &query), bucket, &settled).await;
                println!(
                    "DONE id={id} ok={} attempts={} r429={} start={} success_start={} end={}",
                    u8::from(log.ok),
                    log.attempts,
                    log.rate_limited,
                    log.start,
                    log.success_start,
                    log.end
                );
            }
        }));
    }
    for caller in callers {
        caller.await.map_err(|e| format!("a caller panicked: {e}"))?;
    }
    if let Some(poller) = poller {
        poller.abort();
    }
    println!(
        "FINISHED status_calls={} settled_ok={} settled_bad={}",
        status_calls.get(),
        settled.ok.get(),
        settled.bad.get()
    );
    Ok(())
}

/// Waits until the scheduler has read the shared store once (scripts loaded, mode shared).
async fn wait_until_shared(scheduler: &Scheduler) -> Result<(), String> {
    let upstream = scheduler.upstream(status_upstream(scheduler)).map_err(|unknown| unknown.to_string())?;
    for _ in 0..200 {
        if let Ok(status) = upstream.status().await
            && status.mode == Mode::Shared
            && status.in_flight_fleet.is_some()
        {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Err("the scheduler did not reach the shared store within 10 s".into())
}

/// Prints the scheduler's view every [`POLL_EVERY`]; counts the reads that went to Redis.
async fn poll_status(scheduler: Scheduler, status_calls: Rc<Cell<u64>>) {
    let Ok(upstream) = scheduler.upstream(status_upstream(&scheduler)) else { return };
    let mut tick = tokio::time::interval(POLL_EVERY);
    loop {
        tick.tick().await;
        let Ok(status) = upstream.status().await else { return };
        if status.mode == Mode::Shared && status.in_flight_fleet.is_some() {
            status_calls.set(status_calls.get() + 1);
        }
        println!(
            "STATUS t={} mode={} state={} limit={} fleet={} local={}",
            now_us(),
            status.mode,
            status.state.as_str(),
            status.limit,
            status.in_flight_fleet.map_or("-".to_string(), |n| n.to_string()),
            status.in_flight_local
        );
    }
}

/// The name of key `key`'s upstream in a pool.
fn member_name(key: u32) -> String {
    format!("{UPSTREAM}-{key}")
}

/// The upstream whose status is polled: the upstream, or a pool's first member.
fn status_upstream(scheduler: &Scheduler) -> &'static str {
    if scheduler.pool(UPSTREAM).is_ok() { "provider-0" } else { UPSTREAM }
}

async fn get(provider: SocketAddr, id: u64, tokens: &str, key: &str) -> std::io::Result<HttpReply> {
    let mut query = Vec::new();
    if !tokens.is_empty() {
        query.push(tokens.to_string());
    }
    if !key.is_empty() {
        query.push(format!("key={key}"));
    }
    let query = if query.is_empty() { String::new() } else { format!("?{}", query.join("&")) };
    http_get(provider, &format!("/job/{id}{query}"), HTTP_TIMEOUT).await
}

/// What a provider's answer means to wavegate: its status, every rate-limit header it sent
/// and its body's error code (`Outcome::from_signals`); a failed exchange is a connect error.
/// With `true`, the usage a served answer's body reports (Anthropic's message: `usage` with
/// `input_tokens` and `output_tokens`), else (or with `false`: OpenAI's buckets keep the
/// estimate charged) the reservation.
struct BodyUsage(bool);

impl wavegate::Meter<HttpReply> for BodyUsage {
    fn tokens_used(&self, reply: &HttpReply, reserved: u64) -> u64 {
        if !self.0 {
            return reserved;
        }
        // The body is one JSON message: read as the data of one event.
        let mut usage = wavegate::SseUsage::new();
        usage.feed(format!("data: {}\n\n", reply.body).as_bytes());
        usage.usage().map_or(reserved, |u| u.tokens())
    }
}

fn classify(result: &Result<HttpReply, Outcome>) -> Outcome {
    match result {
        Ok(reply) => {
            let headers = reply.headers.iter().map(|(name, value)| (name.as_str(), value.as_bytes()));
            let signals = ProviderSignals::from_headers(headers, SystemTime::now());
            Outcome::from_signals(reply.status, wavegate_testkit::error_code(&reply.body), signals)
        }
        Err(outcome) => *outcome,
    }
}

/// How many streamed answers settled exactly the usage their provider reported (prompt +
/// completion tokens), and how many did not (or reported none).
#[derive(Debug, Default)]
pub(crate) struct Settled {
    ok: Cell<u64>,
    bad: Cell<u64>,
}

/// The bytes of a streamed answer's body, as they arrive (chunked framing included: its size
/// lines are not `data:` lines, and the provider writes whole events per chunk).
type Body = std::pin::Pin<Box<dyn futures_util::Stream<Item = std::io::Result<Vec<u8>>>>>;

/// A streamed answer whose head has been read: the head (a refusal's whole body in it), and
/// the rest of the body to come (empty for a refusal).
struct Opened {
    head: HttpReply,
    body: Body,
}

/// `GET path`, the head read; the body left to stream (a status other than 200: read whole).
async fn open_stream(provider: SocketAddr, path: &str) -> std::io::Result<Opened> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut tcp = tokio::time::timeout(HTTP_TIMEOUT, tokio::net::TcpStream::connect(provider))
        .await
        .map_err(|_| std::io::Error::from(std::io::ErrorKind::TimedOut))??;
    let request =
        format!("GET {path} HTTP/1.1\r\nHost: {provider}\r\nAccept: text/event-stream\r\nConnection: close\r\n\r\n");
    tcp.write_all(request.as_bytes()).await?;
    let mut raw = Vec::new();
    let mut buf = [0u8; 4096];
    let end = loop {
        let n = tokio::time::timeout(HTTP_TIMEOUT, tcp.read(&mut buf))
            .await
            .map_err(|_| std::io::Error::from(std::io::ErrorKind::TimedOut))??;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        raw.extend_from_slice(&buf[..n]);
        if let Some(at) = raw.windows(4).position(|w| w == b"\r\n\r\n") {
            break at + 4;
        }
    };
    let rest = raw.split_off(end);
    let text = String::from_utf8_lossy(&raw);
    let mut lines = text.split("\r\n");
    let status = lines.next().and_then(|l| l.split_whitespace().nth(1)).and_then(|c| c.parse().ok()).unwrap_or(0);
    let headers: Vec<(String, String)> = lines
        .filter_map(|line| line.split_once(':'))
        .map(|(name, value)| (name.trim().to_string(), value.trim().to_string()))
        .collect();
    let retry_after = headers.iter().find(|(n, _)| n.eq_ignore_ascii_case("retry-after")).map(|(_, v)| v.clone());
    let mut head = HttpReply { status, retry_after, headers, body: String::new() };
    if status != 200 {
        let mut body = rest;
        let _ = tokio::time::timeout(HTTP_TIMEOUT, tcp.read_to_end(&mut body)).await;
        head.body = String::from_utf8_lossy(&body).into_owned();
        return Ok(Opened { head, body: Box::pin(futures_util::stream::empty()) });
    }
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
    Ok(Opened { head, body: Box::pin(first.chain(more)) })
}

/// [`classify`] of a streamed answer's head.
fn classify_opened(result: &Result<Opened, Outcome>) -> Outcome {
    match result {
        Ok(opened) => classify(&Ok(opened.head.clone())),
        Err(outcome) => *outcome,
    }
}

/// One job of a streamed answer through wavegate: `call_stream` (the permit held, its lease
/// renewed, until the stream's end), the stream read to its end in the caller, the tokens
/// settled from the final usage (`SseUsage`) and checked against `expected` (prompt +
/// completion, what the provider reports).
async fn stream_job(
    scheduler: &Scheduler,
    provider: SocketAddr,
    path: &str,
    tokens: u64,
    log: &mut JobLog,
    (expected, settled): (Option<u64>, &Settled),
) {
    let upstream = scheduler.upstream(UPSTREAM).expect("configured");
    let (attempts, rate_limited, last_sent, last_status) =
        (Cell::new(0u32), Cell::new(0u32), Cell::new(0u64), Cell::new(0u16));
    let result = upstream
        .request()
        .tokens(tokens)
        .classify(classify_opened)
        .meter(SseUsage::new())
        .call_stream(
            |_attempt| {
                attempts.set(attempts.get() + 1);
                last_sent.set(now_us());
                let (rate_limited, last_status) = (&rate_limited, &last_status);
                async move {
                    match open_stream(provider, path).await {
                        Ok(opened) => {
                            rate_limited.set(rate_limited.get() + u32::from(opened.head.status == 429));
                            last_status.set(opened.head.status);
                            Ok(opened)
                        }
                        Err(_) => Err(Outcome::from_transport(TransportError::Connect)),
                    }
                }
            },
            |opened| opened.body,
        )
        .await;
    (log.attempts, log.rate_limited) = (attempts.get(), rate_limited.get());
    match result {
        Ok(mut answer) => {
            let mut whole = last_status.get() == 200;
            while let Some(item) = answer.next().await {
                if let Err(error) = item {
                    eprintln!("worker {}: the stream of {path} failed: {error}", std::process::id());
                    whole = false;
                    break;
                }
            }
            if whole {
                (log.ok, log.success_start) = (true, last_sent.get());
                let counter = if answer.tokens_used() == expected { &settled.ok } else { &settled.bad };
                counter.set(counter.get() + 1);
            }
        }
        Err(error) => eprintln!("worker {}: {path} failed: {error}", std::process::id()),
    }
}

fn jitter(base: Duration, low: f64, high: f64) -> Duration {
    base.mul_f64(rand::rng().random_range(low..=high))
}

async fn run_job(
    kind: &Kind,
    runner: &Runner,
    provider: SocketAddr,
    id: u64,
    (tokens, query): (u64, &str),
    bucket: Option<Bucket>,
    settled: &Settled,
) -> JobLog {
    let get = |provider, id| get(provider, id, query, "");
    let mut log = JobLog { start: now_us(), ..JobLog::default() };
    match (kind, runner) {
        (Kind::Wavegate { .. }, Runner::Wavegate(scheduler)) if bucket.is_some_and(|b| b.stream) => {
            let expected = bucket.map(|b| b.prompt_of(id) + b.output_of(id));
            stream_job(scheduler, provider, &format!("/job/{id}?{query}"), tokens, &mut log, (expected, settled)).await;
        }
        (Kind::Naive { attempts, base, cap }, _) => {
            for attempt in 1..=*attempts {
                log.attempts = attempt;
                let sent = now_us();
                let reply = get(provider, id).await;
                if matches!(reply, Ok(ref r) if r.status == 200) {
                    (log.ok, log.success_start) = (true, sent);
                    break;
                }
                log.rate_limited += u32::from(matches!(reply, Ok(ref r) if r.status == 429));
                if attempt < *attempts {
                    let ceiling = (*base * 2u32.saturating_pow(attempt - 1)).min(*cap);
                    tokio::time::sleep(jitter(ceiling, 0.0, 1.0)).await;
                }
            }
        }
        (Kind::Semaphore { backoffs, .. }, Runner::Semaphore(semaphore)) => {
            for attempt in 0..=backoffs.len() {
                log.attempts = attempt as u32 + 1;
                let permit = semaphore.acquire().await.expect("the semaphore is never closed");
                let sent = now_us();
                let reply = get(provider, id).await;
                drop(permit);
                if matches!(reply, Ok(ref r) if r.status == 200) {
                    (log.ok, log.success_start) = (true, sent);
                    break;
                }
                log.rate_limited += u32::from(matches!(reply, Ok(ref r) if r.status == 429));
                if let Some(backoff) = backoffs.get(attempt) {
                    tokio::time::sleep(jitter(*backoff, 0.5, 1.5)).await;
                }
            }
        }
        (Kind::Wavegate { .. }, Runner::Wavegate(scheduler)) => {
            let attempts = Rc::new(Cell::new(0u32));
            let rate_limited = Rc::new(Cell::new(0u32));
            let last_sent = Rc::new(Cell::new(0u64));
            let (a, r, s) = (attempts.clone(), rate_limited.clone(), last_sent.clone());
            if let Ok(pool) = scheduler.pool(UPSTREAM) {
                let result = pool
                    .request()
                    .tokens(tokens)
                    .classify(classify)
                    .call(|member, _attempt| {
                        attempts.set(attempts.get() + 1);
                        last_sent.set(now_us());
                        let member = member.to_string();
                        let rate_limited = rate_limited.clone();
                        async move {
                            match self::get(provider, id, query, &member).await {
                                Ok(reply) => {
                                    rate_limited.set(rate_limited.get() + u32::from(reply.status == 429));
                                    Ok(reply)
                                }
                                Err(_) => Err(Outcome::from_transport(TransportError::Connect)),
                            }
                        }
                    })
                    .await;
                (log.attempts, log.rate_limited) = (attempts.get(), rate_limited.get());
                if result.as_ref().is_ok_and(|reply| reply.status == 200) {
                    (log.ok, log.success_start) = (true, last_sent.get());
                } else if let Err(error) = result {
                    eprintln!("worker {}: job {id} failed: {error}", std::process::id());
                }
                log.end = now_us();
                return log;
            }
            let upstream = scheduler.upstream(UPSTREAM).expect("configured");
            // Anthropic's output is its own budget: `max_tokens` of the estimate, settled from
            // the answer's usage (Anthropic gives back what was not produced).
            let output = bucket.filter(|b| b.is_anthropic()).map_or(0, |b| b.max_tokens_of(id));
            let result = upstream
                .request()
                .tokens(tokens)
                .output_tokens(output)
                .classify(classify)
                .meter(BodyUsage(output > 0))
                .call(move |_attempt| {
                    let (a, r, s) = (a.clone(), r.clone(), s.clone());
                    async move {
                        a.set(a.get() + 1);
                        s.set(now_us());
                        match get(provider, id).await {
                            Ok(reply) => {
                                r.set(r.get() + u32::from(reply.status == 429));
                                Ok(reply)
                            }
                            Err(_) => Err(Outcome::from_transport(TransportError::Connect)),
                        }
                    }
                })
                .await;
            (log.attempts, log.rate_limited) = (attempts.get(), rate_limited.get());
            if result.as_ref().is_ok_and(|reply| reply.status == 200) {
                (log.ok, log.success_start) = (true, last_sent.get());
            } else if let Err(error) = result {
                eprintln!("worker {}: job {id} failed: {error}", std::process::id());
            }
        }
        (Kind::Oracle, Runner::Oracle(oracle)) => {
            // A 429 is rare (a capacity that just fell): retried 5 ms later through the limiter.
            for attempt in 1..=ORACLE_ATTEMPTS {
                log.attempts = attempt;
                oracle.acquire().await;
                let sent = now_us();
                let reply = get(provider, id).await;
                oracle.release(reply.as_ref().ok());
                if matches!(reply, Ok(ref r) if r.status == 200) {
                    (log.ok, log.success_start) = (true, sent);
                    break;
                }
                log.rate_limited += u32::from(matches!(reply, Ok(ref r) if r.status == 429));
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
        (Kind::Oracle, Runner::BucketOracle(oracle)) => {
            // A 429 or a 500 is retried through the oracle (charged again, as the provider does).
            // A streamed answer is read to its end (`http_get` reads to the end of the body)
            // with the place held. With Anthropic's buckets the call waits at the provider,
            // in arrival order, until they hold it (`queue=1`).
            let anthropic = bucket.is_some_and(|b| b.is_anthropic());
            let queued = format!("{query}&queue=1");
            for attempt in 1..=ORACLE_ATTEMPTS {
                log.attempts = attempt;
                let permit = if anthropic { oracle.slot().await } else { oracle.acquire(tokens).await };
                let sent = now_us();
                let reply = if anthropic {
                    // It may wait at the provider for most of a minute.
                    http_get(provider, &format!("/job/{id}?{queued}"), QUEUED_TIMEOUT).await
                } else {
                    get(provider, id).await
                };
                drop(permit);
                if matches!(reply, Ok(ref r) if r.status == 200) {
                    (log.ok, log.success_start) = (true, sent);
                    break;
                }
                log.rate_limited += u32::from(matches!(reply, Ok(ref r) if r.status == 429));
            }
        }
        _ => unreachable!("the runner is built from the same strategy"),
    }
    log.end = now_us();
    log
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_environment_round_trips() {
        let env = WorkerEnv {
            strategy: "semaphore",
            provider: "127.0.0.1:9".parse().expect("addr"),
            redis_url: None,
            callers: 3,
            limit: 10,
            lease: Duration::from_secs(5),
            poll_status: false,
            index: 1,
            processes: 4,
            oracle_capacity: 8,
            oracle_rate: Some((500, 10)),
            tokens: 200,
            keys: 3,
            rpm: 1_000,
            bucket: None,
        };
        let vars = env.to_env();
        let get = |k: &str| vars.iter().find(|(name, _)| *name == k).map(|(_, v)| v.as_str());
        assert_eq!(get("WORKER_STRATEGY"), Some("semaphore"));
        assert_eq!(get("WORKER_LEASE_MS"), Some("5000"));
        assert_eq!(get("WORKER_REDIS_URL"), Some(""));
        assert_eq!(num::<u64>("GO t0=5", "t0"), Some(5));
        assert_eq!(get("WORKER_ORACLE_RATE"), Some("500/10"));
    }
}
