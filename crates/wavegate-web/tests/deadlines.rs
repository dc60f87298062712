//! Deadlines that refuse early, over real HTTP: an actix-web server on loopback whose handler
//! gives each call the deadline the client asks for. A call that cannot get a permit before
//! it is answered at once with 503, `Retry-After` (the time it would have needed) and a JSON
//! body; the status page shows the queue and the expected wait.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use actix_web::{HttpResponse, web};

mod common;
use wavegate::{Outcome, Scheduler, UpstreamConfig};
use wavegate_testkit::{HttpReply, http_get};
use wavegate_web::{STATUS_PATH, WebError, configure, install_prometheus};

const TIMEOUT: Duration = Duration::from_secs(5);

/// Calls `paced` with a deadline of `ms` milliseconds from now.
async fn call(scheduler: web::Data<Scheduler>, ms: web::Path<u64>) -> Result<HttpResponse, WebError> {
    let upstream = scheduler.upstream("paced").map_err(|unknown| WebError(unknown.into()))?;
    let answer = upstream
        .request()
        .timeout(Duration::from_millis(ms.into_inner()))
        .call(|_| async { Ok::<_, Outcome>("an answer") })
        .await?;
    Ok(HttpResponse::Ok().body(answer))
}

async fn serve() -> SocketAddr {
    let metrics = install_prometheus().expect("recorder");
    // One request every 2 s, burst 1.
    let upstream = UpstreamConfig::builder("paced").limit(5).requests_per_minute(30, 1).build().expect("valid");
    let scheduler = Scheduler::builder().upstream(upstream).build().expect("scheduler");
    common::serve(move |app| {
        app.app_data(web::Data::new(scheduler.clone()))
            .app_data(web::Data::new(metrics.clone()))
            .route("/call/{ms}", web::get().to(call));
        configure(app);
    })
}

async fn get(addr: SocketAddr, path: &str) -> (HttpReply, Duration) {
    let started = Instant::now();
    let reply = http_get(addr, path, TIMEOUT).await.expect("HTTP GET");
    (reply, started.elapsed())
}

fn json(reply: &HttpReply) -> serde_json::Value {
    serde_json::from_str(&reply.body).unwrap_or_else(|e| panic!("not JSON ({e}): {:?}", reply.body))
}

#[actix_web::test]
async fn a_deadline_no_permit_can_meet_is_a_503_with_retry_after_at_once() {
    let addr = serve().await;
    let (reply, _) = get(addr, "/call/500").await;
    assert_eq!((reply.status, reply.body.as_str()), (200, "an answer"), "{reply:?}");
    // The next request has room in 2 s: a 500 ms deadline cannot be met.
    let (reply, elapsed) = get(addr, "/call/500").await;
    assert_eq!(reply.status, 503, "{reply:?}");
    assert!(elapsed < Duration::from_millis(200), "answered after {elapsed:?}, not at once");
    let retry_after: u64 = reply.retry_after.as_deref().expect("Retry-After").parse().expect("seconds");
    assert_eq!(retry_after, 2, "{reply:?}");
    let body = json(&reply);
    assert_eq!(body["code"], "deadline_passed", "{body}");
    assert_eq!(body["retry_after_seconds"], 2, "{body}");
    // The status: nobody waits, and a newcomer waits for the budget's room (under 2 s).
    let (reply, _) = get(addr, STATUS_PATH).await;
    let upstream = &json(&reply)["upstreams"][0];
    assert_eq!(upstream["queue_depth"], 0, "{upstream}");
    let expected = upstream["expected_wait_ms"].as_u64().expect("an expected wait");
    assert!(expected > 1_000 && expected <= 2_000, "{upstream}");
    // A deadline past the room: the call waits and is served.
    let (reply, elapsed) = get(addr, "/call/3000").await;
    assert_eq!(reply.status, 200, "{reply:?}");
    assert!(elapsed > Duration::from_millis(800), "served after {elapsed:?}");
}
