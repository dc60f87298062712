//! The easy mistakes of embedding, over real HTTP: schedulers built inside `HttpServer::new`'s
//! factory (one per worker) share one limit and are reported by the status; `configure` without the Prometheus
//! handle still serves `/metrics`; a missing handle or scheduler is answered with what to add.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::time::Duration;

use actix_web::{App, HttpServer, web};

mod common;
use wavegate::{Outcome, Scheduler, UpstreamConfig};
use wavegate_testkit::{HttpReply, http_get};
use wavegate_web::{METRICS_PATH, STATUS_PATH, configure, metrics_handler, status_handler};

const TIMEOUT: Duration = Duration::from_secs(5);

async fn get(addr: SocketAddr, path: &str) -> HttpReply {
    http_get(addr, path, TIMEOUT).await.expect("HTTP GET")
}

fn json(reply: &HttpReply) -> serde_json::Value {
    serde_json::from_str(&reply.body).unwrap_or_else(|e| panic!("not JSON ({e}): {:?}", reply.body))
}

fn start(server: actix_web::dev::Server, addr: SocketAddr) -> SocketAddr {
    actix_web::rt::spawn(server);
    addr
}

#[actix_web::test]
async fn schedulers_built_in_the_server_factory_share_one_limit_and_are_reported() {
    // One scheduler per worker (the easy mistake): they share the upstream's in-process gate,
    // so the provider never sees more than the limit, however many workers serve the calls.
    const LIMIT: usize = 2;
    let in_flight = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let (seen, peak) = (in_flight.clone(), most.clone());
    let server = HttpServer::new(move || {
        let upstream = UpstreamConfig::builder("per-worker").limit(LIMIT as u32).build().expect("config");
        let scheduler = Scheduler::builder().upstream(upstream).build().expect("scheduler");
        let (seen, peak) = (seen.clone(), peak.clone());
        App::new().app_data(web::Data::new(scheduler)).configure(configure).route(
            "/call",
            web::get().to(move |scheduler: web::Data<Scheduler>| {
                let (seen, peak) = (seen.clone(), peak.clone());
                async move {
                    let upstream = scheduler.upstream("per-worker").expect("configured");
                    upstream
                        .request()
                        .call(|_| async {
                            let now = seen.fetch_add(1, SeqCst) + 1;
                            peak.fetch_max(now, SeqCst);
                            tokio::time::sleep(Duration::from_millis(30)).await;
                            seen.fetch_sub(1, SeqCst);
                            Ok::<_, Outcome>("ok")
                        })
                        .await
                        .map_err(wavegate_web::WebError::from)
                }
            }),
        )
    })
    .workers(3)
    .disable_signals()
    .bind(("127.0.0.1", 0))
    .expect("bind");
    let addr = server.addrs()[0];
    let addr = start(server.run(), addr);
    let calls = (0..30).map(|_| get(addr, "/call"));
    let replies = futures_util::future::join_all(calls).await;
    assert!(replies.iter().all(|r| r.status == 200), "{replies:?}");
    assert!(most.load(SeqCst) <= LIMIT, "{} calls at once with a limit of {LIMIT}", most.load(SeqCst));
    assert_eq!(in_flight.load(SeqCst), 0);
    // The status says so, once every worker has built its app.
    let started = std::time::Instant::now();
    let body = loop {
        let body = json(&get(addr, STATUS_PATH).await);
        if body["upstreams"][0]["schedulers_in_process"] == 3 || started.elapsed() > Duration::from_secs(2) {
            break body;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let view = &body["upstreams"][0];
    assert_eq!(view["schedulers_in_process"], 3, "{body}");
    let warning = view["warning"].as_str().expect("a warning");
    assert!(warning.contains("3 local-mode schedulers") && warning.contains("share one limit"), "{warning}");
}

#[actix_web::test]
async fn one_scheduler_built_before_the_server_has_no_warning() {
    let upstream = UpstreamConfig::builder("built-once").limit(10).build().expect("config");
    let scheduler = Scheduler::builder().upstream(upstream).build().expect("scheduler");
    let addr = common::serve_with(2, move |app| {
        app.app_data(web::Data::new(scheduler.clone()));
        configure(app);
    });
    let body = json(&get(addr, STATUS_PATH).await);
    assert_eq!(body["upstreams"][0]["schedulers_in_process"], 1, "{body}");
    assert!(body["upstreams"][0].get("warning").is_none(), "{body}");
}

#[actix_web::test]
async fn configure_serves_metrics_without_the_handle_in_the_app() {
    let upstream = UpstreamConfig::builder("metered").limit(2).build().expect("config");
    let scheduler = Scheduler::builder().upstream(upstream).build().expect("scheduler");
    let calls = scheduler.clone();
    let addr = common::serve(move |app| {
        app.app_data(web::Data::new(scheduler.clone()));
        configure(app);
    });
    // The first answer shows the recorder is in place (installed when the app was built).
    assert_eq!(get(addr, METRICS_PATH).await.status, 200);
    let metered = calls.upstream("metered").expect("configured");
    metered.request().call(|_| async { Ok::<_, Outcome>(()) }).await.expect("a call");
    let reply = get(addr, METRICS_PATH).await;
    assert_eq!(reply.status, 200, "{reply:?}");
    let line = reply.body.lines().find(|line| line.starts_with("wavegate_upstream_call_seconds_count{"));
    assert!(line.is_some_and(|line| line.contains("upstream=\"metered\"")), "{}", reply.body);
}

#[actix_web::test]
async fn the_handlers_say_what_is_missing_instead_of_a_bare_500() {
    let response = metrics_handler(None).await;
    assert_eq!(response.status(), 500);
    let body = actix_web::body::to_bytes(response.into_body()).await.expect("body");
    let text = String::from_utf8_lossy(&body);
    assert!(text.contains("web::Data<PrometheusHandle>"), "{text}");

    let response = status_handler(None).await.expect("a response");
    assert_eq!(response.status(), 500);
    let body = actix_web::body::to_bytes(response.into_body()).await.expect("body");
    let body: serde_json::Value = serde_json::from_slice(&body).expect("JSON");
    assert_eq!(body["code"], "scheduler_missing");
    assert!(body["message"].as_str().expect("message").contains("web::Data<Scheduler>"));
}
