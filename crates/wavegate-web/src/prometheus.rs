//! `/metrics`: wavegate's metrics in the Prometheus text format.
//!
//! [`install_prometheus`] installs the Prometheus recorder as the process's `metrics`
//! recorder, with each wavegate histogram rendered as a Prometheus histogram with its own
//! buckets ([`wavegate::metrics::HISTOGRAM_BUCKETS`]), not as a summary. It is idempotent: the
//! first call installs, later calls return the same handle.

use std::sync::OnceLock;

use actix_web::{HttpResponse, web};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

/// The recorder could not be installed (another `metrics` recorder is installed already).
#[derive(Debug, Clone, thiserror::Error)]
#[error("cannot install the Prometheus recorder: {0}")]
pub struct InstallError(String);

/// Installs (once) the Prometheus recorder and returns its handle.
pub fn install_prometheus() -> Result<PrometheusHandle, InstallError> {
    static HANDLE: OnceLock<Result<PrometheusHandle, InstallError>> = OnceLock::new();
    HANDLE
        .get_or_init(|| {
            let mut builder = PrometheusBuilder::new();
            for (name, buckets) in wavegate::metrics::HISTOGRAM_BUCKETS {
                builder = builder
                    .set_buckets_for_metric(Matcher::Full((*name).to_string()), buckets)
                    .map_err(|e| InstallError(e.to_string()))?;
            }
            builder.install_recorder().map_err(|e| InstallError(e.to_string()))
        })
        .clone()
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

/// The Prometheus text of every metric of the process (what `/metrics` answers).
pub(crate) fn render(handle: &PrometheusHandle) -> String {
    handle.run_upkeep();
    handle.render()
}

/// The content type of the Prometheus text format.
pub(crate) const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// What `/metrics` says when it has no recorder to render.
pub(crate) const MISSING: &str = "wavegate: /metrics is mounted but the app holds no web::Data<PrometheusHandle>, and \
    the Prometheus recorder could not be installed (another metrics recorder is installed): add \
    .app_data(web::Data::new(handle)) with the handle of the Prometheus recorder in use\n";
