//! `/metrics`: wavegate's metrics in the Prometheus text format.
//!
//! [`install_prometheus`] installs the Prometheus recorder as the process's `metrics`
//! recorder, with each wavegate histogram rendered as a Prometheus histogram with its own
//! buckets ([`wavegate::metrics::HISTOGRAM_BUCKETS`]), not as a summary. It is idempotent: the
//! first call installs, later calls return the same handle.

use std::sync::OnceLock;

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

/// The Prometheus text of every metric of the process (what `/metrics` answers).
#[cfg(any(feature = "actix-web", feature = "axum"))]
pub(crate) fn render(handle: &PrometheusHandle) -> String {
    handle.run_upkeep();
    handle.render()
}

/// The content type of the Prometheus text format.
#[cfg(any(feature = "actix-web", feature = "axum"))]
pub(crate) const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";
