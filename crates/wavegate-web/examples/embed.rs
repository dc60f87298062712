//! Embedding wavegate in an actix-web app: the scheduler built once (before `HttpServer::new`,
//! never inside its factory) and in `web::Data` with its upstream's handle, a handler that
//! calls a provider through it, `/metrics` and `/wavegate/status` mounted by `configure`.
use std::time::{Duration, SystemTime};

use actix_web::{App, HttpResponse, HttpServer, web};
use wavegate::{Outcome, Scheduler, Upstream, UpstreamConfig};
use wavegate_web::{WebError, configure, install_prometheus};

async fn ask(llm: web::Data<Upstream>) -> Result<HttpResponse, WebError> {
    let answer = llm
        .request()
        .call(|_attempt| async {
            // Call the provider here; map its answer to Ok(..) or Err(Outcome::..) (or return
            // your client's own result and classify it with `.classify(..)`).
            let (status, retry_after): (u16, Option<&str>) = (200, None);
            match status {
                200..=299 => Ok("an answer".to_string()),
                _ => Err(Outcome::from_status(status, retry_after, SystemTime::now())),
            }
        })
        .await?; // saturated → 503 + Retry-After + {"code": "waited_too_long", ...}
    Ok(HttpResponse::Ok().body(answer))
}

#[actix_web::main]
async fn main() -> std::io::Result<()> {
    let metrics = install_prometheus().map_err(std::io::Error::other)?;
    let scheduler = Scheduler::builder()
        .upstream(
            UpstreamConfig::builder("llm")
                .limit(10)
                .max_wait(Duration::from_secs(5))
                .build()
                .map_err(std::io::Error::other)?,
        )
        // .redis("redis://127.0.0.1:6379/") to share the limit across processes
        .build()
        .map_err(std::io::Error::other)?;
    let llm = scheduler.upstream("llm").map_err(std::io::Error::other)?;
    HttpServer::new(move || {
        App::new()
            .app_data(web::Data::new(scheduler.clone()))
            .app_data(web::Data::new(llm.clone()))
            .app_data(web::Data::new(metrics.clone()))
            .route("/ask", web::post().to(ask))
            .configure(configure)
    })
    .bind(("127.0.0.1", 8080))?
    .run()
    .await
}
