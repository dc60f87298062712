//! What shadow mode recorded: the calls let through, and what their ghosts met — how long
//! each would have waited for its permit, which would have been refused and why (see
//! [`ShadowScope`](wavegate_core::ShadowScope) for the mode itself).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;
use wavegate_core::{CallResult, WaveSignal};

use crate::served::{CallOut, CallsOut};

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
    /// Of them, retries let through without a ghost of their own: the attempt before met a
    /// 429 or a failure that enforcing would not have met (more of this process's calls were
    /// at the provider than the limit lets through), so enforcing would not have retried, and
    /// the call's first ghost stands for the whole call.
    pub retries_without_ghost: u64,
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

/// Whether a call in shadow failed, for what enforcing would have met: a 429, or a failure of
/// the upstream (5xx, transport error, timeout).
pub(crate) fn is_failure(signal: WaveSignal, result: CallResult) -> bool {
    signal.rate_limited().is_some() || result == CallResult::Failure
}

/// Whether enforcing would have met a 429 or a failure of a call in shadow while the
/// provider served at most `served` of this process's calls at once (itself included,
/// `CallOut::end`) and the limit was `limit`. Enforcing lets no more than the limit through:
/// a provider that refused or failed with no more than that at it would have done the same to
/// enforcing, and its answer is the limit's to learn from. With more at it, the answer may be the extra calls' doing:
/// enforcing would have held them back, and this call would most likely have succeeded.
pub(crate) fn enforcing_meets_failure(served: usize, limit: u32) -> bool {
    served <= limit as usize
}

/// A call in shadow's verdict on its own failure, for the call's retries: set when a retry
/// after it goes without a ghost (`Grant::shadow_covers_retry`).
#[derive(Debug, Clone, Default)]
pub(crate) struct RetryCovered {
    covered: Arc<AtomicBool>,
    /// In a fleet (other schedulers call the provider too, `Lane::in_fleet`): whether the
    /// call's ghost was granted at once. This process counts only its own calls at the
    /// provider, so a failure counts as enforcing's only when the fleet's ghosts also left room
    /// for this one at once (enforcing would have sent it then); `None` for a process alone,
    /// whose count is the fleet's.
    fleet: Option<Arc<FleetVerdict>>,
}

/// A fleet's verdict: a failure can come back before the ghost's grant does (a provider that
/// refuses faster than a store round trip); it waits for it.
#[derive(Debug, Default)]
struct FleetVerdict {
    state: Mutex<FleetState>,
    /// Wakes a call loop waiting for the verdict ([`RetryCovered::settled`]).
    known: Notify,
}

#[derive(Debug, Default)]
struct FleetState {
    /// Whether the ghost was granted at once; `None` while its first answer is not known.
    at_once: Option<bool>,
    /// A failure that came before it: the calls served at once and the limit.
    pending: Option<(usize, u32)>,
}

impl RetryCovered {
    /// Already set: for a retry that had no ghost.
    pub(crate) fn set() -> Self {
        Self { covered: Arc::new(AtomicBool::new(true)), fleet: None }
    }

    /// Not set yet; `fleet`: other schedulers call the provider too (see the `fleet` field).
    pub(crate) fn new(fleet: bool) -> Self {
        Self { covered: Arc::default(), fleet: fleet.then(Arc::default) }
    }

    /// The call's ghost was answered: granted at once, or not (granted after a wait, refused,
    /// or gone). The first answer stands ([`settled`](Self::settled) may have given one);
    /// a failure that came before it is judged now.
    pub(crate) fn ghost_answered(&self, at_once: bool) {
        let Some(fleet) = &self.fleet else { return };
        let mut state = lock(&fleet.state);
        if state.at_once.is_none() {
            state.at_once = Some(at_once);
            if let Some((served, limit)) = state.pending.take() {
                self.judge(at_once, served, limit);
            }
        }
        drop(state);
        fleet.known.notify_waiters();
    }

    /// The call failed — with a 429 if `rate_limited` — while the provider served `served`
    /// of this process's calls at once (itself included) and the limit was `limit`: sets the
    /// verdict unless enforcing would have met the failure too (`enforcing_meets_failure`; in
    /// a fleet, with a ghost granted at once — judged when its answer comes, if it has not
    /// yet). In a fleet a 429 always sets it: whether enforcing would have met it is known
    /// only once the fleet's calls beside it have ended, and its ghost stands for the call
    /// (`lane/shadow.rs`).
    pub(crate) fn failed(&self, served: usize, limit: u32, rate_limited: bool) {
        let Some(fleet) = &self.fleet else {
            self.judge(true, served, limit);
            return;
        };
        if rate_limited {
            self.covered.store(true, Ordering::Release);
            return;
        }
        let mut state = lock(&fleet.state);
        match state.at_once {
            Some(at_once) => self.judge(at_once, served, limit),
            None => state.pending = Some((served, limit)),
        }
    }

    fn judge(&self, at_once: bool, served: usize, limit: u32) {
        if !at_once || !enforcing_meets_failure(served, limit) {
            self.covered.store(true, Ordering::Release);
        }
    }

    /// The verdict as it stands (a failure waiting for its ghost's answer is not set yet).
    pub(crate) fn get(&self) -> bool {
        self.covered.load(Ordering::Acquire)
    }

    /// The verdict, once a failure waiting for its ghost's answer has it — waiting at most
    /// `bound`: a ghost not answered by then was not granted at once, and is taken as such.
    pub(crate) async fn settled(&self, bound: Duration) -> bool {
        if let Some(fleet) = &self.fleet {
            let until = tokio::time::Instant::now() + bound;
            loop {
                let known = fleet.known.notified();
                if lock(&fleet.state).pending.is_none() {
                    break;
                }
                if tokio::time::timeout_at(until, known).await.is_err() {
                    self.ghost_answered(false);
                    break;
                }
            }
        }
        self.get()
    }
}

/// The counts, shared by a lane and its ghosts.
#[derive(Debug, Clone, Default)]
pub(crate) struct ShadowTally {
    counts: Arc<Mutex<ShadowStatus>>,
    /// This process's calls at the provider, and what it served at once (`served.rs`).
    passes: Arc<Mutex<CallsOut>>,
    /// How long a call that succeeds takes, smoothed (nanoseconds; 0 before the first): how
    /// long the ghost of a call enforcing would not have seen fail holds its permit.
    success_hold_ns: Arc<AtomicU64>,
    /// The longest a call that succeeded took (nanoseconds; 0 before the first): how long
    /// after a 429 in a fleet the calls beside it may still run (`lane/shadow.rs`).
    longest_success_ns: Arc<AtomicU64>,
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

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl ShadowTally {
    fn update(&self, change: impl FnOnce(&mut ShadowStatus)) {
        change(&mut lock(&self.counts));
    }

    /// A call let through goes to the provider: the mark that counts it until it ends.
    pub(crate) fn pass_out(&self) -> CallOut {
        CallsOut::go(&self.passes)
    }

    /// A call let through succeeded after `took`: the smoothed hold of calls that succeed
    /// moves a fifth of the way towards it.
    pub(crate) fn succeeded_in(&self, took: Duration) {
        let took = u64::try_from(took.as_nanos()).unwrap_or(u64::MAX).max(1);
        self.longest_success_ns.fetch_max(took, Ordering::Relaxed);
        let _ = self.success_hold_ns.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |smoothed| {
            Some(if smoothed == 0 { took } else { smoothed - smoothed / 5 + took / 5 })
        });
    }

    /// The longest a call that succeeded took; `None` before the first.
    pub(crate) fn longest_success(&self) -> Option<Duration> {
        let longest = self.longest_success_ns.load(Ordering::Relaxed);
        (longest > 0).then(|| Duration::from_nanos(longest))
    }

    /// How long a call that succeeds takes here, smoothed; `None` before the first.
    pub(crate) fn success_hold(&self) -> Option<Duration> {
        let smoothed = self.success_hold_ns.load(Ordering::Relaxed);
        (smoothed > 0).then(|| Duration::from_nanos(smoothed))
    }

    /// A retry let through without a ghost (see [`ShadowStatus::retries_without_ghost`]).
    pub(crate) fn let_retry_through(&self) {
        self.update(|s| {
            s.calls += 1;
            s.retries_without_ghost += 1;
        });
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
        let mut status = lock(&self.counts).clone();
        status.upstream = scope.is_upstream();
        status.classes = scope.classes().to_vec();
        status
    }
}
