//! A store that answers but rejects wavegate: its own mode in the status, an error log that
//! repeats.
//!
//! A wrong password, an ACL user without a right the scripts need, or a server too old is not
//! an outage that will pass: the process still fails open to its fallback share (it cannot
//! share), but [`Mode::Rejected`](crate::Mode::Rejected) says so instead of `fallback`,
//! `Scheduler::store_health` gives the server's words, and the probe's failures are logged as
//! errors every [`REJECTION_LOG_EVERY`] for as long as it lasts.

use std::time::Duration;

use super::actor::Coordinator;
use crate::engine::clock::Instant;
use crate::engine::store::{self, StoreError};

/// How often a lasting rejection is logged again.
const REJECTION_LOG_EVERY: Duration = Duration::from_secs(10);

impl Coordinator {
    /// Logs a rejection as an error, at most once every [`REJECTION_LOG_EVERY`].
    pub(super) fn log_rejection(&mut self, command: &'static str, error: &StoreError) {
        let Some((reason, advice)) = store::rejection(error) else { return };
        let now = Instant::now();
        if self.rejection_logged.is_some_and(|at| now.duration_since(at) < REJECTION_LOG_EVERY) {
            return;
        }
        self.rejection_logged = Some(now);
        tracing::error!(
            command,
            %error,
            reason,
            advice,
            "the shared store rejects wavegate: permits come from this process's fallback share until it accepts again"
        );
    }
}
