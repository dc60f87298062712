//! The web glue over real HTTP: an actix-web server on loopback, real requests.

use std::net::SocketAddr;
use std::time::{Duration, SystemTime};

use actix_web::{HttpResponse, web};

mod common;
use wavegate::{Outcome, Scheduler, UpstreamConfig};
use wavegate_testkit::{HttpReply, http_get};
use wavegate_web::{METRICS_PATH, STATUS_PATH, WebError, configure, install_prometheus};

const TIMEOUT: Duration = Duration::from_secs(5);

/// Calls the upstream named in the path; the closure answers after `ms` milliseconds with
/// `status` (200 → success) on the first attempt and 200 afterwards.
async fn call(scheduler: web::Data<Scheduler>, path: web::Path<(String, u16, u64)>) -> Result<HttpResponse, WebError> {
    let (upstream, status, ms) = path.into_inner();
    let upstream = scheduler.upstream(&upstream).map_err(|unknown| WebError(unknown.into()))?;
    let answer = upstream
        .request()
        .call(move |attempt| async move {
            tokio::time::sleep(Duration::from_millis(ms)).await;
            match (status, attempt.number) {
                (200, _) | (429, 2..) => Ok(format!("ok after {} attempts", attempt.number)),
                (status, _) => Err(Outcome::from_status(status, Some("0.05"), SystemTime::now())),
            }
        })
        .await?;
    Ok(HttpResponse::Ok().body(answer))
}

async fn serve(upstream: UpstreamConfig) -> SocketAddr {
    let metrics = install_prometheus().expect("recorder");
    let scheduler = Scheduler::builder().upstream(upstream).build().expect("scheduler");
    common::serve(move |app| {
        app.app_data(web::Data::new(scheduler.clone()))
            .app_data(web::Data::new(metrics.clone()))
            .route("/call/{upstream}/{status}/{ms}", web::get().to(call));
        configure(app);
    })
}

async fn get(addr: SocketAddr, path: &str) -> HttpReply {
    http_get(addr, path, TIMEOUT).await.expect("HTTP GET")
}

fn json(reply: &HttpReply) -> serde_json::Value {
    serde_json::from_str(&reply.body).unwrap_or_else(|e| panic!("not JSON ({e}): {:?}", reply.body))
}

#[actix_web::test]
async fn saturation_is_a_503_with_retry_after_and_a_stable_code() {
    let upstream = UpstreamConfig::builder("saturated").limit(1).max_wait(Duration::from_millis(100)).build().unwrap();
    let addr = serve(upstream).await;
    let holder = actix_web::rt::spawn(async move { get(addr, "/call/saturated/200/400").await });
    tokio::time::sleep(Duration::from_millis(50)).await;
    let refused = get(addr, "/call/saturated/200/0").await;
    assert_eq!(refused.status, 503, "{refused:?}");
    let retry_after: u64 = refused.retry_after.as_deref().expect("Retry-After").parse().expect("seconds");
    assert!(retry_after >= 1);
    let body = json(&refused);
    assert_eq!(body["code"], "waited_too_long");
    assert_eq!(body["retry_after_seconds"], retry_after);
    assert!(body["message"].as_str().expect("message").contains("saturated"));
    assert_eq!(holder.await.expect("holder").status, 200);
}

#[actix_web::test]
async fn an_upstream_client_error_is_not_turned_into_a_503() {
    let addr = serve(UpstreamConfig::builder("picky").build().unwrap()).await;
    let reply = get(addr, "/call/picky/400/0").await;
    assert_eq!(reply.status, 502, "{reply:?}");
    assert_eq!(reply.retry_after, None);
    let body = json(&reply);
    assert_eq!((body["code"].as_str(), body["upstream_status"].as_u64()), (Some("upstream_error"), Some(400)));
    let unknown = get(addr, "/call/nope/200/0").await;
    assert_eq!((unknown.status, json(&unknown)["code"].as_str()), (500, Some("unknown_upstream")));
}

#[actix_web::test]
async fn a_call_timeout_is_a_504_that_says_it_timed_out() {
    let upstream = UpstreamConfig::builder("slow")
        .call_timeout(Duration::from_millis(50))
        .renewed_lease(Duration::from_secs(30))
        .build()
        .unwrap();
    let addr = serve(upstream).await;
    let reply = get(addr, "/call/slow/200/400").await;
    assert_eq!(reply.status, 504, "{reply:?}");
    assert_eq!(reply.retry_after, None);
    let body = json(&reply);
    assert_eq!(body["code"], "upstream_timeout");
    let message = body["message"].as_str().expect("message");
    assert!(message.starts_with("upstream `slow` timed out"), "{message}");
}

#[actix_web::test]
async fn metrics_hold_the_named_series_and_they_move() {
    let upstream = UpstreamConfig::builder("metered")
        .limit(4)
        .recovery(wavegate::config::Recovery::Seed)
        .min_cooldown(Duration::from_millis(50))
        .max_wait(Duration::from_millis(200))
        .build()
        .unwrap();
    let addr = serve(upstream).await;
    assert_eq!(get(addr, "/call/metered/200/5").await.status, 200);
    assert_eq!(get(addr, "/call/metered/429/5").await.status, 200, "a 429 is retried after the cooldown");
    let metrics = get(addr, METRICS_PATH).await;
    assert_eq!(metrics.status, 200);
    let text = metrics.body;
    let value = |series: &str| -> f64 {
        text.lines()
            .find(|line| line.starts_with(series))
            .and_then(|line| line.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no series {series} in:\n{text}"))
    };
    assert_eq!(value(r#"wavegate_rate_limited_total{upstream="metered"}"#), 1.0);
    assert_eq!(value(r#"wavegate_limit_cuts_total{upstream="metered"}"#), 1.0);
    assert_eq!(value(r#"wavegate_retries_total{upstream="metered",reason="rate_limited"}"#), 1.0);
    assert_eq!(value(r#"wavegate_wave{upstream="metered"}"#), 2.0);
    assert_eq!(value(r#"wavegate_limit{upstream="metered"}"#), 1.0, "PROBE after the cut");
    assert_eq!(value(r#"wavegate_wave_state{upstream="metered",state="PROBE"}"#), 1.0);
    assert_eq!(value(r#"wavegate_permits_in_flight{upstream="metered",scope="local"}"#), 0.0);
    assert_eq!(value(r#"wavegate_queue_depth{upstream="metered"}"#), 0.0);
    assert_eq!(value(r#"wavegate_breaker_state{upstream="metered",state="closed"}"#), 1.0);
    assert_eq!(value(r#"wavegate_mode{mode="local"}"#), 1.0);
    assert_eq!(value(r#"wavegate_mode{upstream="metered",mode="local"}"#), 1.0, "each upstream's mode");
    // Histograms are Prometheus histograms with buckets, not summaries.
    assert_eq!(value(r#"wavegate_upstream_call_seconds_count{upstream="metered",outcome="success"}"#), 2.0);
    assert_eq!(value(r#"wavegate_upstream_call_seconds_count{upstream="metered",outcome="rate_limited"}"#), 1.0);
    assert!(text.contains(r#"wavegate_upstream_call_seconds_bucket{upstream="metered",outcome="success",le="0.01"}"#));
    assert!(text.contains(r#"wavegate_permit_wait_seconds_bucket{upstream="metered",le="120"}"#), "{text}");
    assert_eq!(value(r#"wavegate_queue_wait_seconds_count{upstream="metered"}"#), 3.0);
    assert!(!text.contains("quantile="), "histograms must not render as summaries");
}

#[actix_web::test]
async fn the_status_endpoint_describes_each_upstream() {
    let addr = serve(UpstreamConfig::builder("described").limit(7).build().unwrap()).await;
    assert_eq!(get(addr, "/call/described/200/0").await.status, 200);
    let reply = get(addr, STATUS_PATH).await;
    assert_eq!(reply.status, 200);
    let body = json(&reply);
    let upstream = &body["upstreams"][0];
    assert_eq!(upstream["upstream"], "described");
    assert_eq!(upstream["mode"], "local");
    assert_eq!(upstream["state"], "NORMAL");
    assert_eq!((upstream["limit"].as_u64(), upstream["base_limit"].as_u64()), (Some(7), Some(7)));
    assert_eq!(upstream["wave"], 1);
    assert_eq!(upstream["in_flight_local"], 0);
    assert_eq!(upstream["in_flight_fleet"], 0);
    assert_eq!(upstream["queue_depth"], 0);
    assert_eq!(upstream["breaker"], "closed");
    assert_eq!(upstream["cooldown_remaining_ms"], 0);
}

#[actix_web::test]
async fn unreadable_signals_and_kinds_of_429_are_counted() {
    let metrics = install_prometheus().expect("recorder");
    let upstream = UpstreamConfig::builder("signalled").min_cooldown(Duration::from_millis(10)).build().unwrap();
    let scheduler = Scheduler::builder().upstream(upstream).build().expect("scheduler");
    let made = std::cell::Cell::new(0);
    let signalled = scheduler.upstream("signalled").expect("configured");
    let result = signalled
        .request()
        .call(|_| {
            made.set(made.get() + 1);
            let now = SystemTime::now();
            let outcome = match made.get() {
                // A Retry-After nobody can read: ignored, and said.
                1 => Outcome::from_status(429, Some("soon"), now),
                _ => Outcome::from_status(429, None, now).with_error_code("insufficient_quota"),
            };
            async move { Err::<(), _>(outcome) }
        })
        .await;
    let error = result.expect_err("the quota is spent");
    assert_eq!((error.kind(), error.attempts()), (wavegate::ErrorKind::QuotaExhausted, Some(2)), "{error:?}");
    let text = metrics.render();
    let value = |series: &str| -> f64 {
        text.lines()
            .find(|line| line.starts_with(series))
            .and_then(|line| line.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no series {series} in:\n{text}"))
    };
    assert_eq!(value(r#"wavegate_unreadable_signals_total{upstream="signalled",kind="retry_after"}"#), 1.0);
    assert_eq!(value(r#"wavegate_refusals_by_kind_total{upstream="signalled",kind="unknown"}"#), 1.0);
    assert_eq!(value(r#"wavegate_refusals_by_kind_total{upstream="signalled",kind="quota_exhausted"}"#), 1.0);
    assert_eq!(value(r#"wavegate_quota_exhausted{upstream="signalled"}"#), 1.0);
    assert!(signalled.reset_quota());
    assert_eq!(value_after(&metrics, r#"wavegate_quota_exhausted{upstream="signalled"}"#), 0.0);
}

fn value_after(metrics: &metrics_exporter_prometheus::PrometheusHandle, series: &str) -> f64 {
    let text = metrics.render();
    text.lines()
        .find(|line| line.starts_with(series))
        .and_then(|line| line.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no series {series} in:\n{text}"))
}

#[actix_web::test]
async fn a_learned_limit_is_in_the_status_and_its_gauge() {
    let metrics = install_prometheus().expect("recorder");
    let scheduler =
        Scheduler::builder().upstream(UpstreamConfig::builder("learning").build().unwrap()).build().unwrap();
    // A 2xx that announces 10 requests per 2 s window (IETF fields): 300 a minute.
    let headers = [("ratelimit-policy", "\"default\";q=10;w=2"), ("ratelimit", "\"default\";r=9;t=2")];
    let signals =
        wavegate::ProviderSignals::from_headers(headers.iter().map(|(n, v)| (*n, v.as_bytes())), SystemTime::now());
    scheduler
        .upstream("learning")
        .expect("configured")
        .request()
        .classify(move |_: &Result<(), std::io::Error>| Outcome::from_signals(200, None, signals))
        .call(|_| async { Ok(()) })
        .await
        .expect("served");
    let status = wavegate_web::status(&scheduler).await.expect("status");
    let body = serde_json::to_value(&status.upstreams[0]).expect("JSON");
    let learned = &body["learned_requests"];
    assert_eq!((learned["limit"].as_u64(), learned["window_ms"].as_u64()), (Some(10), Some(2_000)), "{body}");
    assert_eq!(learned["per_minute"].as_u64(), Some(300));
    assert!(learned["forgotten_in_ms"].as_u64().is_some_and(|ms| ms > 5_000 && ms <= 6_000), "{learned}");
    assert!(body["requests_budget"]["remaining"].as_u64().is_some(), "a learned limit is a budget: {body}");
    assert!(body["learned_tokens"].is_null());
    // wavegate's own status, serialized (feature `serde`): the core types nest as they are.
    let own = serde_json::to_value(&scheduler.statuses().await.expect("statuses")[0]).expect("JSON");
    let kept = &own["learned"]["requests"];
    assert_eq!(
        (kept["limit"]["limit"].as_u64(), kept["limit"]["window_ms"].as_u64()),
        (Some(10), Some(2_000)),
        "{own}"
    );
    assert!(kept["forgotten_in"]["secs"].as_u64().is_some(), "{own}");
    assert!(own["budgets"]["requests"][0].as_u64().is_some(), "(remaining, next refill in ms): {own}");
    // The gauges are refreshed every second.
    tokio::time::sleep(Duration::from_millis(1_300)).await;
    assert_eq!(
        value_after(&metrics, r#"wavegate_learned_limit_per_minute{upstream="learning",budget="requests"}"#),
        300.0
    );
}

#[actix_web::test]
async fn the_scheduler_status_types_serialize() {
    let upstream = UpstreamConfig::builder("serialized").limit(3).class("interactive", 3).build().unwrap();
    let scheduler = Scheduler::builder().upstream(upstream).build().expect("scheduler");
    let statuses = scheduler.statuses().await.expect("statuses");
    let body = serde_json::to_value(&statuses).expect("JSON");
    let status = &body[0];
    assert_eq!((status["upstream"].as_str(), status["mode"].as_str()), (Some("serialized"), Some("local")), "{body}");
    assert_eq!((status["state"].as_str(), status["limit"].as_u64()), (Some("NORMAL"), Some(3)));
    assert_eq!(status["cooldown_remaining"], serde_json::json!({"secs": 0, "nanos": 0}));
    assert_eq!(status["breaker"], "closed");
    assert_eq!(
        status["budgets"],
        serde_json::json!({
            "requests": null, "tokens": null, "input": null, "output": null, "requests_per_day": null,
            "tokens_per_day": null
        })
    );
    assert_eq!(status["learned"], serde_json::json!({"requests": null, "tokens": null, "input": null, "output": null}));
    assert_eq!(
        (status["classes"][0]["class"].as_str(), status["classes"][0]["weight"].as_u64()),
        (Some("interactive"), Some(3))
    );
}
