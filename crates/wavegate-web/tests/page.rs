//! The status page in a real headless browser: an actix-web server on loopback with a real
//! scheduler in front of a mock provider that answers 429 beyond its capacity, calls driven
//! through it, then Chromium (`/usr/bin/chromium`, or `$WAVEGATE_CHROMIUM`) loads
//! `/wavegate`, runs its script, and the test reads what the page shows from the DOM Chromium
//! dumps. A screenshot goes to the target directory; its path is printed.
//!
//! In local mode by default; with this crate's `redis` feature (CI's `--all-features` run) the
//! scheduler shares a `redis-server` the test starts with three more (a fleet of four
//! processes, with traffic of their own), and the page shows the four.
//!
//! Chromium is a requirement: without it the test fails and says how to install it.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime};

use actix_web::web;

mod common;
use wavegate::{Outcome, Scheduler, UpstreamConfig};
use wavegate_testkit::{MockUpstream, MockUpstreamConfig, http_get};
use wavegate_web::{HISTORY_PATH, PAGE_PATH, configure};

/// The longest any one HTTP exchange of the test may take.
const HTTP_TIMEOUT: Duration = Duration::from_secs(5);
/// The longest Chromium may take to load, run and dump the page.
const BROWSER_TIMEOUT: Duration = Duration::from_secs(60);
/// The upstreams: one in front of the mock provider, one whose permits the test holds, and
/// eight more with light traffic (ten cards, as a fleet's page would show).
const UPSTREAMS: [(&str, u32); 10] = [
    ("llm", 6),
    ("images", 3),
    ("embeddings", 20),
    ("search", 8),
    ("speech", 4),
    ("translate", 10),
    ("vision", 5),
    ("moderation", 12),
    ("rerank", 6),
    ("summarize", 4),
];

fn chromium() -> PathBuf {
    let path = std::env::var_os("WAVEGATE_CHROMIUM").map_or_else(|| PathBuf::from("/usr/bin/chromium"), PathBuf::from);
    assert!(
        path.exists(),
        "the status page test needs Chromium at {}: install it (`apt-get install -y chromium`, as .ci/run's tools \
         step does) or point WAVEGATE_CHROMIUM at a Chromium binary",
        path.display()
    );
    path
}

/// Runs Chromium headless on `url` with `args`, its standard output into `out`; kills it (by
/// its pid) if it is not done within [`BROWSER_TIMEOUT`].
async fn run_chromium(url: &str, args: &[String], out: &Path) {
    let profile = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("chromium-profile-{}", std::process::id()));
    let stdout = std::fs::File::create(out).expect("chromium's output file");
    let mut child = Command::new(chromium())
        .args(["--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run"])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(args)
        .arg(url)
        .stdin(Stdio::null())
        .stdout(stdout)
        .stderr(Stdio::null())
        .spawn()
        .expect("chromium starts");
    let started = Instant::now();
    loop {
        if let Some(status) = child.try_wait().expect("chromium's status") {
            assert!(status.success(), "chromium failed: {status}");
            break;
        }
        if started.elapsed() > BROWSER_TIMEOUT {
            let _ = child.kill();
            let _ = child.wait();
            panic!("chromium (pid {}) did not finish within {BROWSER_TIMEOUT:?}: killed", child.id());
        }
        // The server answers the browser on this thread meanwhile.
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let _ = std::fs::remove_dir_all(&profile);
}

/// A call through `upstream` to the mock provider: a 429 goes back to the scheduler as one.
async fn call_mock(scheduler: &Scheduler, upstream: &str, provider: SocketAddr) {
    let upstream = scheduler.upstream(upstream).expect("configured");
    let _ = upstream
        .request()
        .call(|_| async move {
            let reply = http_get(provider, "/", HTTP_TIMEOUT)
                .await
                .map_err(|_| Outcome::from_status(503, None, SystemTime::now()))?;
            match reply.status {
                200 => Ok(()),
                status => Err(Outcome::from_status(status, reply.retry_after.as_deref(), SystemTime::now())),
            }
        })
        .await;
}

/// The schedulers of the fleet: the page's first. In local mode it is alone; with the `redis`
/// feature three more share the test's `redis-server` (returned too, to be stopped last).
fn fleet() -> (Vec<Scheduler>, Option<wavegate_testkit::RedisServer>) {
    let prefix = format!("page-{}", std::process::id());
    let build = |redis: Option<&str>| {
        let mut builder = Scheduler::builder().key_prefix(prefix.clone());
        for (name, limit) in UPSTREAMS {
            let config = UpstreamConfig::builder(name).limit(limit).max_wait(Duration::from_secs(30)).build().unwrap();
            builder = builder.upstream(config);
        }
        #[cfg(feature = "redis")]
        if let Some(url) = redis {
            builder = builder.redis(url);
        }
        #[cfg(not(feature = "redis"))]
        let _ = redis;
        builder.build().expect("scheduler")
    };
    if cfg!(feature = "redis") {
        let redis = wavegate_testkit::RedisServer::start().expect("redis-server");
        let url = redis.url();
        ((0..4).map(|_| build(Some(&url))).collect(), Some(redis))
    } else {
        (vec![build(None)], None)
    }
}

/// Light traffic on `upstream` until the test ends: calls of 50 to 250 ms, a few at once.
async fn background(scheduler: Scheduler, upstream: &'static str, seed: u64) {
    let handle = scheduler.upstream(upstream).expect("configured");
    let mut n = seed;
    loop {
        n = n.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
        let took = Duration::from_millis(50 + (n >> 33) % 200);
        let handle = handle.clone();
        actix_web::rt::spawn(async move {
            let _ = handle
                .request()
                .call(|_| async move {
                    tokio::time::sleep(took).await;
                    Ok::<_, Outcome>(())
                })
                .await;
        });
        tokio::time::sleep(Duration::from_millis(40 + (n >> 40) % 120)).await;
    }
}

/// The `<section>` of upstream `name`'s card in the dumped DOM.
fn card<'a>(dom: &'a str, name: &str) -> &'a str {
    let marker = format!("data-upstream=\"{name}\"");
    let start = dom.find(&marker).unwrap_or_else(|| panic!("no card for `{name}` in the page:\n{dom}"));
    let end = dom[start..].find("</section>").map_or(dom.len(), |end| start + end);
    &dom[start..end]
}

/// The text of the element with `data-figure="key"` in `card`.
fn figure<'a>(card: &'a str, key: &str) -> &'a str {
    let marker = format!("data-figure=\"{key}\"");
    let at = card.find(&marker).unwrap_or_else(|| panic!("no figure `{key}` in the card:\n{card}"));
    let text = &card[at..];
    let open = text.find('>').expect("the element's end") + 1;
    let close = text[open..].find('<').expect("the element's text end") + open;
    &text[open..close]
}

fn number(card: &str, key: &str) -> u64 {
    let text = figure(card, key);
    text.parse().unwrap_or_else(|_| panic!("figure `{key}` is {text:?}, not a number, in:\n{card}"))
}

/// The number of points of the first line drawn in chart `key` of `card`.
fn points(card: &str, key: &str) -> usize {
    let chart = &card[card.find(&format!("data-chart=\"{key}\"")).unwrap_or_else(|| panic!("no chart `{key}`"))..];
    let chart = &chart[..chart.find("</svg>").expect("the chart's end")];
    let Some(at) = chart.find("data-points=\"") else { return 0 };
    let rest = &chart[at + "data-points=\"".len()..];
    rest[..rest.find('"').expect("quoted")].parse().expect("a count")
}

async fn history(addr: SocketAddr) -> serde_json::Value {
    let reply = http_get(addr, HISTORY_PATH, HTTP_TIMEOUT).await.expect("GET /wavegate/history");
    assert_eq!(reply.status, 200, "{reply:?}");
    serde_json::from_str(&reply.body).expect("JSON")
}

fn upstream<'a>(history: &'a serde_json::Value, name: &str) -> &'a serde_json::Value {
    history["upstreams"].as_array().expect("upstreams").iter().find(|u| u["upstream"] == name).expect("listed")
}

fn last(history: &serde_json::Value, name: &str, series: &str) -> u64 {
    upstream(history, name)["samples"][series].as_array().and_then(|s| s.last()).and_then(|v| v.as_u64()).unwrap_or(0)
}

fn total(history: &serde_json::Value, name: &str, series: &str) -> u64 {
    upstream(history, name)["samples"][series].as_array().map_or(0, |s| s.iter().filter_map(|v| v.as_u64()).sum())
}

#[actix_web::test]
async fn the_page_shows_each_upstream_its_limit_its_calls_and_its_429s() {
    chromium();
    // Two calls at once at most, a 429 with `Retry-After: 2` beyond: the cooldown lasts
    // seconds, so a sample sees it.
    let provider = MockUpstream::start(MockUpstreamConfig {
        capacity: Some(2),
        service_time: Duration::from_millis(300),
        retry_after: "2".to_string(),
        ..MockUpstreamConfig::default()
    })
    .expect("mock provider");
    let (fleet, _redis) = fleet();
    let scheduler = fleet[0].clone();
    let app_scheduler = scheduler.clone();
    let addr = common::serve(move |app| {
        app.app_data(web::Data::new(app_scheduler.clone()));
        configure(app);
    });

    // `images`: the test holds its three permits, and one more caller waits.
    let images = scheduler.upstream("images").unwrap();
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(images.request().acquire().await.expect("a free permit"));
    }
    let waiter = images.clone();
    let waiting = actix_web::rt::spawn(async move { waiter.request().acquire().await.map(drop) });
    // Light traffic on the eight others, from every process of the fleet.
    let mut traffic = Vec::new();
    for (process, scheduler) in fleet.iter().enumerate() {
        for (seed, (name, _)) in UPSTREAMS.iter().enumerate().skip(2) {
            traffic.push(actix_web::rt::spawn(background(scheduler.clone(), name, (seed * 7 + process) as u64)));
        }
    }
    // `llm`: six calls at once against a provider that takes two: some are answered 429, the
    // limit is cut, the upstream cools down, then they are served.
    let calls: Vec<_> = (0..6)
        .map(|_| {
            let scheduler = scheduler.clone();
            let provider = provider.addr();
            actix_web::rt::spawn(async move { call_mock(&scheduler, "llm", provider).await })
        })
        .collect();
    let driven = tokio::time::timeout(Duration::from_secs(40), futures_util::future::join_all(calls)).await;
    assert!(driven.is_ok(), "the calls to `llm` did not finish within 40 s");
    let rate_limited = provider.rate_limited();
    assert!(rate_limited > 0, "the mock answered no 429: nothing for the page's 429 chart");

    // The history has every 429 and the held permits, and a few seconds of samples (four of
    // `images`, so every upstream has three by the time the browser reads them).
    let deadline = Instant::now() + Duration::from_secs(10);
    let body = loop {
        let body = history(addr).await;
        let samples = upstream(&body, "images")["samples"]["at_ms"].as_array().map_or(0, Vec::len);
        if total(&body, "llm", "rate_limited") == rate_limited
            && last(&body, "images", "in_flight_local") == 3
            && last(&body, "images", "waiting") == 1
            && samples >= 4
        {
            break body;
        }
        assert!(Instant::now() < deadline, "the history never showed the calls: {body:#}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let samples: usize =
        body["upstreams"].as_array().unwrap().iter().map(|u| u["samples"]["at_ms"].as_array().unwrap().len()).sum();
    println!("history: {} bytes of JSON for {samples} samples", body.to_string().len());
    let (processes, mode) = if fleet.len() > 1 { ("4", "shared") } else { ("this one (local mode)", "local") };
    if fleet.len() > 1 {
        assert_eq!(body["processes"], 4, "the fleet's four processes");
    } else {
        assert_eq!(body["processes"], serde_json::Value::Null, "local mode: no fleet count");
    }

    // What the browser shows.
    let url = format!("http://{addr}{PAGE_PATH}");
    let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let dom_file = out.join("status-page.html");
    let budget = ["--virtual-time-budget=3000".to_string(), "--window-size=1500,1000".to_string()];
    run_chromium(&url, &[budget[0].clone(), "--dump-dom".to_string()], &dom_file).await;
    let dom = std::fs::read_to_string(&dom_file).expect("the dumped DOM");
    assert!(dom.contains("id=\"cards\""), "not the status page:\n{dom}");
    assert!(dom.contains(&format!("<b id=\"processes\">{processes}</b>")), "the processes live:\n{dom}");
    let error = &dom[dom.find("id=\"error\"").expect("the error box")..];
    let error = &error[error.find('>').expect("its end") + 1..error.find("</div>").expect("its close")];
    assert_eq!(error, "", "the page shows an error");
    for (name, limit) in UPSTREAMS {
        let card = card(&dom, name);
        assert_eq!(figure(card, "base-limit"), format!("/{limit}"), "{name}");
        let now = number(card, "limit");
        assert!((1..=u64::from(limit)).contains(&now), "{name}: limit {now} of {limit}");
        assert!(points(card, "in-flight") >= 3, "{name}: the in-flight chart has no line:\n{card}");
    }
    let llm = card(&dom, "llm");
    assert_eq!(number(llm, "rate-limited"), rate_limited, "the 429s the provider sent:\n{llm}");
    // The timeline starts NORMAL and shows the wave the 429s started (a step back or a cooldown).
    let timeline = &llm[llm.find("data-chart=\"modes\"").expect("the mode timeline")..];
    assert!(timeline.contains("data-state=\"NORMAL\""), "{timeline}");
    assert!(
        ["DEGRADED", "COOLDOWN", "PROBE"].iter().any(|s| timeline.contains(&format!("data-state=\"{s}\""))),
        "the mode timeline misses the wave:\n{timeline}"
    );
    assert!(points(llm, "rate-limited") >= 3, "the 429 chart has no line:\n{llm}");
    let images_card = card(&dom, "images");
    assert_eq!(number(images_card, "limit"), 3);
    assert_eq!(number(images_card, "in-flight"), 3, "the held permits:\n{images_card}");
    assert_eq!(number(images_card, "waiting"), 1, "the waiting caller:\n{images_card}");
    assert_eq!(figure(images_card, "mode"), mode);
    assert_eq!(figure(images_card, "state"), "NORMAL");

    // A screenshot, for people (and the docs).
    let screenshot = out.join("status-page.png");
    let _ = std::fs::remove_file(&screenshot);
    let mut args = budget.to_vec();
    args.push(format!("--screenshot={}", screenshot.display()));
    run_chromium(&url, &args, &out.join("status-page-screenshot.log")).await;
    let png = std::fs::read(&screenshot).expect("the screenshot");
    assert!(png.starts_with(b"\x89PNG"), "not a PNG: {}", screenshot.display());
    println!("status page screenshot: {}", screenshot.display());

    for task in traffic {
        task.abort();
    }
    waiting.abort();
    drop(held);
}

#[actix_web::test]
async fn without_a_scheduler_the_history_says_what_to_add_and_the_page_is_still_served() {
    let addr = common::serve(configure);
    let page = http_get(addr, PAGE_PATH, HTTP_TIMEOUT).await.expect("GET /wavegate");
    assert_eq!(page.status, 200);
    assert!(page.header("content-type").is_some_and(|t| t.starts_with("text/html")), "{page:?}");
    assert!(page.body.contains("/history"), "the page reads its history");
    assert!(!page.body.contains("://cdn") && !page.body.contains("<script src"), "self-contained");
    let reply = http_get(addr, HISTORY_PATH, HTTP_TIMEOUT).await.expect("GET /wavegate/history");
    assert_eq!(reply.status, 500);
    let body: serde_json::Value = serde_json::from_str(&reply.body).expect("JSON");
    assert_eq!(body["code"], "scheduler_missing");
    assert!(body["message"].as_str().is_some_and(|m| m.contains(HISTORY_PATH) && m.contains("web::Data<Scheduler>")));
}
