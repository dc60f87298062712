//! A store that answers but rejects wavegate: its own mode in the status, an error log that
//! repeats.
//!
//! A wrong password, an ACL user without a right the scripts need, or a server too old is not
//! an outage that will pass: the process still fails open to its fallback share (it cannot
//! share), but [`Mode::Rejected`] says so instead of `fallback`, `Scheduler::store_health`
//! gives the server's words, and the probe's failures are logged as errors every
//! [`REJECTION_LOG_EVERY`] for as long as it lasts.

use std::time::Duration;
#[cfg(feature = "redis")]
use std::time::Instant;

#[cfg(feature = "redis")]
use crate::store::StoreError;

use super::Coordinator;
use crate::status::Mode;

/// How often a lasting rejection is logged again.
pub(super) const REJECTION_LOG_EVERY: Duration = Duration::from_secs(10);

impl Coordinator {
    /// The mode of `upstream` as reported, or with `None` the process's: the least shared of
    /// its upstreams' (see `domains::least_shared`). A fallback caused by a rejection is
    /// [`Mode::Rejected`].
    pub(super) fn reported_mode(&self, upstream: Option<usize>) -> Mode {
        let mode = match upstream {
            Some(upstream) => self.mode_of(upstream),
            None => super::domains::least_shared(&self.domains),
        };
        #[cfg(feature = "redis")]
        if let (Some(store), Mode::Fallback) = (&self.store, mode)
            && store.health().rejected.is_some()
        {
            return Mode::Rejected;
        }
        mode
    }

    /// Logs a rejection as an error, at most once every [`REJECTION_LOG_EVERY`].
    #[cfg(feature = "redis")]
    pub(super) fn log_rejection(&mut self, command: &'static str, error: &StoreError) {
        let Some(reason) = error.rejection() else { return };
        let now = Instant::now();
        if self.rejection_logged.is_some_and(|at| now.duration_since(at) < REJECTION_LOG_EVERY) {
            return;
        }
        self.rejection_logged = Some(now);
        tracing::error!(
            command,
            %error,
            reason = reason.as_str(),
            advice = reason.advice(),
            "the shared store rejects wavegate: permits come from this process's fallback share until it accepts again"
        );
    }
}
