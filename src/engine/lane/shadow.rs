//! Shadow mode in the lane: a call in shadow is answered at once with a pass (a grant that
//! holds nothing), and a *ghost* takes its place in the admission and the queue. When the
//! ghost is granted, it records how long the call would have waited, then holds the permit as
//! long as the call took — from its own grant, as enforcing would have started the call then —
//! and reports the call's outcome: the budgets are charged its usage, and the wave and the
//! breaker learn from it — from a 429 or a failure only when the ghost was granted at once (a
//! call enforcing would have held met a provider busier than enforcing would have let it be:
//! its 429 is not the limit's; its success still is one). A ghost refused records why; the
//! call went on anyway.

use tokio::sync::oneshot;
use wavegate_core::{Clock, WaveState};

use super::actor::Lane;
use crate::engine::clock::{self, Instant};
use crate::engine::grant::{Grant, GrantInfo, ShadowFinish};
use crate::engine::request::{ClassRef, Request};
use crate::error::Error;
use crate::metrics;
use crate::shadow::{GhostHolds, PassOut, ShadowTally};
use crate::status::Mode;
use wavegate_core::TenantTag;

/// The reply channel of an acquire.
type Reply = oneshot::Sender<Result<Grant, Error>>;

impl Lane {
    /// The class of `request` (its index) when its calls run in shadow now; `None` when they
    /// do not, or it names a class the upstream does not have (refused as usual).
    pub(super) fn shadow_class(&self, request: &Request) -> Option<usize> {
        if self.config.shadow().is_off() {
            return None;
        }
        let class = match &request.class {
            ClassRef::Default => self.config.default_class(),
            ClassRef::Named(name) => self.config.class_index(name)?,
        };
        self.config.is_shadow(class).then_some(class)
    }

    /// Answers `reply` at once with a pass for a request of class `class` (of `tenant`, for
    /// `tokens`) that asked at `asked`, and starts its ghost; returns the reply the ghost
    /// waits on, for the admission to answer.
    pub(super) fn let_through(
        &mut self,
        reply: Reply,
        tenant: Option<TenantTag>,
        tokens: u64,
        class: usize,
        asked: Instant,
    ) -> Reply {
        let (state, limit, wave) = self.seen_wave();
        self.sequence += 1;
        let class_name = self.config.classes().get(class).map(|c| c.name());
        let tenant = tenant.filter(|_| class_name.is_some());
        let id = wavegate_core::PermitId::new(class_name, &self.instance, self.sequence, tenant);
        let info = GrantInfo { at_once: true, ..GrantInfo::granted(id, wave, state, limit, (tokens, 0)) };
        let (finished, finish) = oneshot::channel();
        let pass = Grant::shadow(info, finished, self.config.cancelled_call_hold());
        let (ghost_reply, granted) = oneshot::channel();
        let name = self.name().to_owned();
        metrics::shadow_call(&name);
        self.shadow.let_through();
        let out = self.shadow.pass_out();
        // Counted until it is done: a drain (shutdown) waits for it, and hurries it.
        let holds = self.shadow.holds();
        let times = (asked, Instant::now());
        actix::spawn(ghost(name, self.shadow.clone(), times, (out, holds), granted, finish));
        // A caller gone already drops the pass; its ghost still runs, as the call would have.
        let _ = reply.send(Ok(pass));
        ghost_reply
    }

    /// After a live change: the callers waiting in a class that runs in shadow now go at
    /// once with a pass, as a call in shadow does; each one's place in the queue becomes its
    /// ghost's, whose wait counts from when the caller asked.
    pub(super) fn let_waiting_through(&mut self) {
        if self.config.shadow().is_off() {
            return;
        }
        let config = &self.config;
        let enforced: Vec<_> = self
            .waiters
            .iter_mut()
            .filter(|w| !w.ghost && !w.reply.is_closed() && config.is_shadow(w.class))
            .map(|w| {
                w.ghost = true;
                // A placeholder until the ghost's reply takes its place, below.
                let reply = std::mem::replace(&mut w.reply, oneshot::channel().0);
                (w.id.clone(), reply, w.tenant, w.tokens, w.class, w.enqueued)
            })
            .collect();
        for (id, reply, tenant, tokens, class, asked) in enforced {
            let ghost = self.let_through(reply, tenant, tokens, class, asked);
            if let Some(waiter) = self.waiters.get_mut(&id) {
                waiter.reply = ghost;
            }
        }
    }

    /// The wave as last seen: the store's in shared mode, the in-process gate's otherwise.
    fn seen_wave(&self) -> (WaveState, u32, u64) {
        match (self.mode, self.last_shared.state) {
            (Mode::Shared, Some((state, limit))) => (state, limit, self.last_shared.wave),
            _ => {
                let snapshot = self.local.snapshot(self.clock.now_ms());
                (snapshot.state, snapshot.limit, snapshot.wave)
            }
        }
    }
}

/// A call's ghost — its caller asked at `asked`, its call went at `started` (the same time,
/// but for a caller let through when shadow was switched on while it waited): waits for the
/// permit the call would have waited for (`granted`), records
/// the wait or the refusal, then holds the permit as long as the call held its pass (`finish`
/// says how it ended) and releases it with the call's outcome. `out` counts the call among
/// this process's calls at the provider (with how many there were when it went) until it ends;
/// `holds` counts the ghost until it is done. A ghost started before a drain (the process
/// shutting down) releases its permit as soon as its call has ended, not a hold later.
async fn ghost(
    name: String,
    tally: ShadowTally,
    (asked, started): (Instant, Instant),
    marks: ((usize, PassOut), GhostHolds),
    granted: oneshot::Receiver<Result<Grant, Error>>,
    finish: oneshot::Receiver<Box<ShadowFinish>>,
) {
    let ((mut together, out), holds) = marks;
    let mut grant = match granted.await {
        Ok(Ok(grant)) => grant,
        Ok(Err(error)) => {
            metrics::shadow_refused(&name, error.code());
            tally.refused(error.code());
            // Counted at the provider until it ends.
            let _ = finish.await;
            return;
        }
        // The lane stopped with the scheduler.
        Err(_) => return,
    };
    grant.mark_received();
    let at = Instant::now();
    let waited = at.saturating_duration_since(asked);
    metrics::shadow_wait(&name, waited);
    tally.granted(waited);
    // The pass always reports (its drop does); a missing report means the scheduler stopped.
    let Ok(finish) = finish.await else { return };
    together = together.max(tally.passes_out());
    drop(out);
    let held = finish.ended.saturating_duration_since(started);
    // The process shutting down does not wait the rest of the hold: the call has ended, and
    // a permit released after the scheduler stopped would stay held in the store until its
    // lease ends.
    {
        let hold = std::pin::pin!(tokio::time::sleep_until(clock::after(at, held)));
        let hurried = std::pin::pin!(tally.hurried(&holds));
        futures_util::future::select(hold, hurried).await;
    }
    // A ghost that waited proves its limit holds only if the provider really served as many
    // calls of this process at once while its call ran.
    let proven = together >= grant.info().limit as usize;
    grant.finish_late(*finish, waited, proven);
    // Its release is in the lane's mailbox now: a drain that waited for it sees it there.
    drop(holds);
}
