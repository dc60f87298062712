//! The axum router over real HTTP (feature `axum`): an axum server on loopback, real requests;
//! the same status body and error responses as the actix-web endpoints.

use std::net::SocketAddr;
use std::time::{Duration, SystemTime};

use axum::Router;
use axum::extract::{Path, State};
use axum::routing::get;
use wavegate::{Outcome, Scheduler, Upstream, UpstreamConfig};
use wavegate_testkit::{HttpReply, http_get};
use wavegate_web::{HISTORY_PATH, METRICS_PATH, PAGE_HTML, PAGE_PATH, STATUS_PATH, WebError};

const TIMEOUT: Duration = Duration::from_secs(5);

/// Calls the upstream; the closure answers after `ms` milliseconds with `status` (200 →
/// success).
async fn call(State(llm): State<Upstream>, Path((status, ms)): Path<(u16, u64)>) -> Result<String, WebError> {
    let answer = llm
        .request()
        .call(|attempt| async move {
            tokio::time::sleep(Duration::from_millis(ms)).await;
            match status {
                200 => Ok(format!("ok after {} attempts", attempt.number)),
                status => Err(Outcome::from_status(status, None, SystemTime::now())),
            }
        })
        .await?;
    Ok(answer)
}

/// Serves the app's own route and wavegate's router, merged, on a loopback port.
async fn serve(scheduler: Scheduler, upstream: &str) -> SocketAddr {
    let app = Router::new()
        .route("/call/{status}/{ms}", get(call))
        .with_state(scheduler.upstream(upstream).expect("configured"))
        .merge(wavegate_web::axum::router(scheduler));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("address");
    tokio::spawn(async move { axum::serve(listener, app).await });
    addr
}

async fn get_reply(addr: SocketAddr, path: &str) -> HttpReply {
    http_get(addr, path, TIMEOUT).await.expect("HTTP GET")
}

fn json(reply: &HttpReply) -> serde_json::Value {
    serde_json::from_str(&reply.body).unwrap_or_else(|e| panic!("not JSON ({e}): {:?}", reply.body))
}

#[tokio::test]
async fn the_status_is_the_actix_body() {
    let scheduler = Scheduler::builder()
        .upstream(UpstreamConfig::builder("described").limit(7).class("interactive", 2).build().unwrap())
        .build()
        .expect("scheduler");
    let addr = serve(scheduler.clone(), "described").await;
    assert_eq!(get_reply(addr, "/call/200/0").await.status, 200);
    let reply = get_reply(addr, STATUS_PATH).await;
    assert_eq!(reply.status, 200, "{reply:?}");
    assert_eq!(reply.header("content-type"), Some("application/json"));
    let body = json(&reply);
    // What the actix-web endpoint serializes, built by the same function.
    let same = serde_json::to_value(wavegate_web::status(&scheduler).await.expect("status")).expect("JSON");
    assert_eq!(body, same);
    let upstream = &body["upstreams"][0];
    assert_eq!((upstream["upstream"].as_str(), upstream["mode"].as_str()), (Some("described"), Some("local")));
    assert_eq!((upstream["limit"].as_u64(), upstream["base_limit"].as_u64()), (Some(7), Some(7)));
    assert_eq!((upstream["state"].as_str(), upstream["breaker"].as_str()), (Some("NORMAL"), Some("closed")));
    assert_eq!(upstream["classes"][0]["class"], "interactive");
}

#[tokio::test]
async fn metrics_are_the_prometheus_text_and_they_move() {
    let scheduler =
        Scheduler::builder().upstream(UpstreamConfig::builder("metered").build().unwrap()).build().expect("scheduler");
    let addr = serve(scheduler, "metered").await;
    assert_eq!(get_reply(addr, "/call/200/5").await.status, 200);
    let reply = get_reply(addr, METRICS_PATH).await;
    assert_eq!(reply.status, 200, "{reply:?}");
    assert_eq!(reply.header("content-type"), Some("text/plain; version=0.0.4; charset=utf-8"));
    let line = reply.body.lines().find(|line| {
        line.starts_with("wavegate_upstream_call_seconds_count{") && line.contains("upstream=\"metered\"")
    });
    assert!(line.is_some_and(|line| line.ends_with(" 1")), "{}", reply.body);
    assert!(reply.body.contains(r#"wavegate_upstream_call_seconds_bucket{upstream="metered",outcome="success",le="#));
}

#[tokio::test]
async fn errors_are_the_actix_responses() {
    let upstream = UpstreamConfig::builder("picky")
        .call_timeout(Duration::from_millis(50))
        .renewed_lease(Duration::from_secs(30))
        .build()
        .unwrap();
    let scheduler = Scheduler::builder().upstream(upstream).build().expect("scheduler");
    let addr = serve(scheduler, "picky").await;

    let refused = get_reply(addr, "/call/400/0").await;
    assert_eq!((refused.status, refused.retry_after.as_deref()), (502, None), "{refused:?}");
    assert_eq!(refused.header("content-type"), Some("application/json"));
    let body = json(&refused);
    assert_eq!((body["code"].as_str(), body["upstream_status"].as_u64()), (Some("upstream_error"), Some(400)));

    let timed_out = get_reply(addr, "/call/200/400").await;
    assert_eq!(timed_out.status, 504, "{timed_out:?}");
    let body = json(&timed_out);
    assert_eq!(body["code"], "upstream_timeout");
    assert!(body["message"].as_str().is_some_and(|m| m.starts_with("upstream `picky` timed out")), "{body}");
}

#[tokio::test]
async fn saturation_is_a_503_with_retry_after() {
    let upstream = UpstreamConfig::builder("saturated").limit(1).max_wait(Duration::from_millis(100)).build().unwrap();
    let scheduler = Scheduler::builder().upstream(upstream).build().expect("scheduler");
    let addr = serve(scheduler, "saturated").await;
    // One call holds the only permit for 400 ms; the next waits 100 ms and is refused.
    let holder = tokio::spawn(async move { get_reply(addr, "/call/200/400").await });
    tokio::time::sleep(Duration::from_millis(50)).await;
    let saturated = get_reply(addr, "/call/200/0").await;
    assert_eq!(saturated.status, 503, "{saturated:?}");
    let seconds: u64 = saturated.retry_after.as_deref().expect("Retry-After").parse().expect("seconds");
    assert!(seconds >= 1);
    let body = json(&saturated);
    assert_eq!((body["code"].as_str(), body["retry_after_seconds"].as_u64()), (Some("waited_too_long"), Some(seconds)));
    assert_eq!(holder.await.expect("holder").status, 200);
}

#[tokio::test]
async fn the_apps_own_recorder_handle_is_rendered() {
    let handle = wavegate_web::install_prometheus().expect("recorder");
    let scheduler =
        Scheduler::builder().upstream(UpstreamConfig::builder("own").build().unwrap()).build().expect("scheduler");
    let own = scheduler.upstream("own").expect("configured");
    own.request().call(|_| async { Ok::<_, Outcome>(()) }).await.expect("a call");
    let app: Router = wavegate_web::axum::router_with_handle(scheduler, handle);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("address");
    tokio::spawn(async move { axum::serve(listener, app).await });
    let reply = get_reply(addr, METRICS_PATH).await;
    assert_eq!(reply.status, 200, "{reply:?}");
    let counted = r#"wavegate_upstream_call_seconds_count{upstream="own",outcome="success"} 1"#;
    assert!(reply.body.contains(counted), "{}", reply.body);
    assert_eq!(get_reply(addr, STATUS_PATH).await.status, 200);
}

#[tokio::test]
async fn the_page_and_its_history_are_served_as_by_actix() {
    let scheduler = Scheduler::builder()
        .upstream(UpstreamConfig::builder("paged").limit(5).build().unwrap())
        .build()
        .expect("scheduler");
    let addr = serve(scheduler.clone(), "paged").await;
    let page = get_reply(addr, PAGE_PATH).await;
    assert_eq!(page.status, 200);
    assert_eq!(page.header("content-type"), Some("text/html; charset=utf-8"));
    assert_eq!(page.body, PAGE_HTML);
    // A 429 reported on a permit (a call through the app would wait out the cooldown).
    let permit = scheduler.upstream("paged").unwrap().request().acquire().await.expect("a permit");
    permit.report(Outcome::from_status(429, Some("1"), SystemTime::now()));
    // The lane samples once a second: wait (bounded) for the one after the 429.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    let body = loop {
        let reply = get_reply(addr, HISTORY_PATH).await;
        assert_eq!(reply.status, 200, "{reply:?}");
        assert_eq!(reply.header("cache-control"), Some("no-store"));
        let body = json(&reply);
        let seen: u64 = body["upstreams"][0]["samples"]["rate_limited"]
            .as_array()
            .expect("a column")
            .iter()
            .filter_map(serde_json::Value::as_u64)
            .sum();
        if seen > 0 {
            break body;
        }
        assert!(std::time::Instant::now() < deadline, "no 429 in the history: {body:#}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let paged = &body["upstreams"][0];
    assert_eq!(paged["upstream"], "paged");
    assert_eq!(paged["base_limit"], 5);
    assert_eq!(paged["mode"], "local");
    assert_eq!(body["processes"], serde_json::Value::Null);
    assert!(
        paged["changes"].as_array().is_some_and(|c| c.iter().any(|c| c["state"] == "COOLDOWN"))
            || paged["state"] != "NORMAL"
    );
}
