//! What shadow mode recorded: the calls let through, and what their ghosts met — how long
//! each would have waited for its permit, which would have been refused and why (see
//! [`ShadowScope`](wavegate_core::ShadowScope) for the mode itself).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;

/// What shadow mode recorded for an upstream in this process, since the scheduler started
/// (all zero when it never ran in shadow). Part of
/// [`UpstreamStatus`](crate::UpstreamStatus); `Serialize` with the `serde` feature.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct ShadowStatus {
    /// Whether the whole upstream runs in shadow now.
    pub upstream: bool,
    /// The priority classes that run in shadow on their own now.
    pub classes: Vec<String>,
    /// Attempts let through at once in shadow.
    pub calls: u64,
    /// Of their ghosts: granted a permit (at once or after a wait).
    pub would_have_granted: u64,
    /// Of those, granted after waiting 1 ms or more.
    pub would_have_waited: u64,
    /// The ghosts' waits, added up.
    pub would_have_waited_total: Duration,
    /// The longest wait of a ghost.
    pub would_have_waited_max: Duration,
    /// Ghosts refused (the call would have failed), by the refusal's
    /// [`code`](crate::Error::code): `waited_too_long`, `queue_full`, `breaker_open`, ...
    pub would_have_refused: BTreeMap<String, u64>,
    /// Ghosts still waiting.
    pub waiting: u64,
}

impl ShadowStatus {
    /// The ghosts refused, all reasons together.
    pub fn refused(&self) -> u64 {
        self.would_have_refused.values().sum()
    }

    /// The mean wait of the ghosts granted (zero when none was).
    pub fn mean_wait(&self) -> Duration {
        let granted = u32::try_from(self.would_have_granted).unwrap_or(u32::MAX);
        self.would_have_waited_total.checked_div(granted).unwrap_or_default()
    }
}

/// The counts, shared by a lane and its ghosts.
#[derive(Debug, Clone, Default)]
pub(crate) struct ShadowTally {
    counts: Arc<Mutex<ShadowStatus>>,
    /// Calls let through that have not ended: this process's calls at the provider.
    passes: Arc<AtomicUsize>,
    /// Ghosts not done yet (waiting, or holding a permit they have not released).
    holding: Arc<AtomicUsize>,
    /// Drains asked so far (`Scheduler::shutdown`, the last handle's drop): a ghost started
    /// before the last one releases its permit at once instead of holding it on.
    drains: Arc<AtomicU64>,
    /// Wakes the ghosts holding when a drain comes.
    hurry: Arc<Notify>,
}

/// A ghost, until it is done (refused, or its permit released): counted in
/// [`ShadowTally`]'s ghosts holding (a drain waits for them).
#[derive(Debug)]
pub(crate) struct GhostHolds {
    holding: Arc<AtomicUsize>,
    /// The drains asked when it started.
    drains: u64,
}

impl Drop for GhostHolds {
    fn drop(&mut self) {
        self.holding.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A call let through, until it ends: counted in [`ShadowTally`]'s calls at the provider.
#[derive(Debug)]
pub(crate) struct PassOut(Arc<AtomicUsize>);

impl Drop for PassOut {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl ShadowTally {
    fn update(&self, change: impl FnOnce(&mut ShadowStatus)) {
        change(&mut self.counts.lock().unwrap_or_else(std::sync::PoisonError::into_inner));
    }

    /// A call let through goes to the provider: how many of this process's are there with it
    /// (itself included), and the mark that counts it until dropped.
    pub(crate) fn pass_out(&self) -> (usize, PassOut) {
        let now = self.passes.fetch_add(1, Ordering::Relaxed) + 1;
        (now, PassOut(self.passes.clone()))
    }

    /// This process's calls at the provider now.
    pub(crate) fn passes_out(&self) -> usize {
        self.passes.load(Ordering::Relaxed)
    }

    /// A ghost starts: the mark that counts it until dropped.
    pub(crate) fn holds(&self) -> GhostHolds {
        self.holding.fetch_add(1, Ordering::Relaxed);
        GhostHolds { holding: self.holding.clone(), drains: self.drains.load(Ordering::Acquire) }
    }

    /// Ghosts not done now.
    pub(crate) fn holding(&self) -> usize {
        self.holding.load(Ordering::Relaxed)
    }

    /// A drain comes: the ghosts started before it release their permits at once.
    pub(crate) fn hurry(&self) {
        self.drains.fetch_add(1, Ordering::AcqRel);
        self.hurry.notify_waiters();
    }

    /// Resolves once a drain is asked after `holds` started (at once if one was).
    pub(crate) async fn hurried(&self, holds: &GhostHolds) {
        let notified = self.hurry.notified();
        if self.drains.load(Ordering::Acquire) != holds.drains {
            return;
        }
        notified.await;
    }

    /// A call let through; its ghost waits.
    pub(crate) fn let_through(&self) {
        self.update(|s| {
            s.calls += 1;
            s.waiting += 1;
        });
    }

    /// A ghost granted after `waited`.
    pub(crate) fn granted(&self, waited: Duration) {
        self.update(|s| {
            s.waiting = s.waiting.saturating_sub(1);
            s.would_have_granted += 1;
            if waited >= Duration::from_millis(1) {
                s.would_have_waited += 1;
            }
            s.would_have_waited_total += waited;
            s.would_have_waited_max = s.would_have_waited_max.max(waited);
        });
    }

    /// A ghost refused with `code`.
    pub(crate) fn refused(&self, code: &str) {
        self.update(|s| {
            s.waiting = s.waiting.saturating_sub(1);
            *s.would_have_refused.entry(code.to_owned()).or_default() += 1;
        });
    }

    /// The counts, with the scope in force.
    pub(crate) fn status(&self, scope: &wavegate_core::ShadowScope) -> ShadowStatus {
        let mut status = self.counts.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone();
        status.upstream = scope.is_upstream();
        status.classes = scope.classes().to_vec();
        status
    }
}
