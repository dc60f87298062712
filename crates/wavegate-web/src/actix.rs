//! The endpoints and the error responses for actix-web (feature `actix-web`, on by default).

use actix_web::http::StatusCode;
use actix_web::http::header::{self, HeaderValue};
use actix_web::{HttpResponse, ResponseError, web};
use metrics_exporter_prometheus::PrometheusHandle;
use wavegate::Scheduler;

use crate::error::{ErrorBody, WebError};
use crate::history::PAGE_HTML;
use crate::prometheus::{CONTENT_TYPE, install_prometheus, render};
use crate::{HISTORY_PATH, METRICS_PATH, PAGE_PATH, STATUS_PATH, history, status};

/// Mounts `/metrics`, `/wavegate/status`, the status page `/wavegate` and its
/// `/wavegate/history`. The app must hold `web::Data<Scheduler>`.
///
/// `/metrics` cannot be mounted without its recorder: `configure` installs the Prometheus
/// recorder ([`install_prometheus`], once per process) and hands its handle to the app. If
/// another `metrics` recorder is installed already, the app's own
/// `web::Data<PrometheusHandle>` is used, and without one `/metrics` answers 500 with a message
/// that says what to add. A missing scheduler is answered the same way on `/wavegate/status`
/// and `/wavegate/history` (and the page shows that message).
pub fn configure(config: &mut web::ServiceConfig) {
    if let Ok(handle) = install_prometheus() {
        config.app_data(web::Data::new(handle));
    }
    config
        .route(METRICS_PATH, web::get().to(metrics_handler))
        .route(STATUS_PATH, web::get().to(status_handler))
        .route(PAGE_PATH, web::get().to(page_handler))
        .route(HISTORY_PATH, web::get().to(history_handler));
}

/// The `/metrics` handler: renders every metric of the process. Needs the handle in
/// `web::Data<PrometheusHandle>`, which [`configure`](crate::configure) provides; without it,
/// it answers 500 with a message that says what to add (not actix's bare 500).
pub async fn metrics_handler(handle: Option<web::Data<PrometheusHandle>>) -> HttpResponse {
    let Some(handle) = handle else {
        return HttpResponse::InternalServerError().content_type("text/plain; charset=utf-8").body(MISSING);
    };
    HttpResponse::Ok().content_type(CONTENT_TYPE).body(render(&handle))
}

/// What `/metrics` says when it has no recorder to render.
const MISSING: &str = "wavegate: /metrics is mounted but the app holds no web::Data<PrometheusHandle>, and \
    the Prometheus recorder could not be installed (another metrics recorder is installed): add \
    .app_data(web::Data::new(handle)) with the handle of the Prometheus recorder in use\n";

/// The status handler. Needs the scheduler in `web::Data<Scheduler>`; without it, it answers
/// 500 with a body that says what to add (not actix's bare 500).
pub async fn status_handler(scheduler: Option<web::Data<Scheduler>>) -> Result<HttpResponse, WebError> {
    let Some(scheduler) = scheduler else {
        return Ok(scheduler_missing(STATUS_PATH));
    };
    Ok(HttpResponse::Ok().json(status(&scheduler).await?))
}

/// The status page's handler: the page itself (it reads `/wavegate/history`, under its own
/// path, every second).
pub async fn page_handler() -> HttpResponse {
    HttpResponse::Ok()
        .content_type("text/html; charset=utf-8")
        .insert_header((header::CACHE_CONTROL, "no-store"))
        .body(PAGE_HTML)
}

/// The history handler: each upstream's last minutes, for the status page. Needs the scheduler
/// in `web::Data<Scheduler>`; without it, it answers 500 with a body that says what to add.
pub async fn history_handler(scheduler: Option<web::Data<Scheduler>>) -> Result<HttpResponse, WebError> {
    let Some(scheduler) = scheduler else {
        return Ok(scheduler_missing(HISTORY_PATH));
    };
    Ok(HttpResponse::Ok().insert_header((header::CACHE_CONTROL, "no-store")).json(history(&scheduler).await?))
}

/// What an endpoint that reads the scheduler says when the app holds none.
fn scheduler_missing(path: &str) -> HttpResponse {
    HttpResponse::InternalServerError().json(ErrorBody {
        code: "scheduler_missing",
        message: format!(
            "wavegate: {path} is mounted but the app holds no web::Data<Scheduler>; add \
             .app_data(web::Data::new(scheduler.clone())) to the App"
        ),
        retry_after_seconds: None,
        upstream_status: None,
    })
}

impl ResponseError for WebError {
    fn status_code(&self) -> StatusCode {
        StatusCode::from_u16(self.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
    }

    fn error_response(&self) -> HttpResponse {
        let mut response = HttpResponse::build(self.status_code());
        if let Some(seconds) = self.retry_after_seconds() {
            response.insert_header((header::RETRY_AFTER, HeaderValue::from(seconds)));
        }
        response.json(self.body())
    }
}
