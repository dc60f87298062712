//! Shadow mode in the lane: a call in shadow is answered at once with a pass (a grant that
//! holds nothing), and a *ghost* takes its place in the admission and the queue. When the
//! ghost is granted, it records how long the call would have waited, then holds the permit as
//! long as the call took — from its own grant, as enforcing would have started the call then —
//! and reports what enforcing would have met: the budgets are charged the call's usage, and
//! the wave and the breaker learn from a 429 or a failure only when no more calls were at the
//! provider than the limit lets through (with more, the call would most likely have succeeded
//! under enforcing: its ghost holds as long as successes take, and its retries go without a
//! ghost of their own: one ghost per call, as enforcing makes one call). A ghost refused
//! records why; the call went on anyway.

use tokio::sync::oneshot;
use wavegate_core::{CallResult, Clock, ServedSpan, WaveSignal, WaveState};

use actix::{AsyncContext, Context, Handler, Recipient};

use super::actor::Lane;
use super::release::Release;
use crate::engine::clock::{self, EngineClock, Instant};
use crate::engine::grant::{FleetMet, FleetReport, Grant, GrantInfo, ShadowFinish};
use crate::engine::request::{ClassRef, Request};
use crate::error::Error;
use crate::metrics;
use crate::shadow::{GhostHolds, RetryCovered, ShadowTally, is_failure};
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
    /// waits on, for the admission to answer, and the call's verdict on its failure (told
    /// when the ghost is known not to be granted at once). A retry its call's first ghost
    /// stands for (`covered`, see [`Grant::shadow_covers_retry`]) gets a pass and no ghost:
    /// `None`.
    pub(super) fn let_through(
        &mut self,
        reply: Reply,
        (tenant, tokens): (Option<TenantTag>, u64),
        class: usize,
        asked: Instant,
        covered: bool,
        ctx: &Context<Self>,
    ) -> Option<(Reply, RetryCovered)> {
        let (state, limit, wave) = self.seen_wave();
        self.sequence += 1;
        let class_name = self.config.classes().get(class).map(|c| c.name());
        let tenant = tenant.filter(|_| class_name.is_some());
        let id = wavegate_core::PermitId::new(class_name, &self.instance, self.sequence, tenant);
        let info = GrantInfo { at_once: true, ..GrantInfo::granted(id, wave, state, limit, (tokens, 0)) };
        let (finished, finish) = oneshot::channel();
        // Counted at the provider until it ends.
        let out = self.shadow.pass_out();
        let fleet = self.in_fleet();
        let verdict = if covered { RetryCovered::set() } else { RetryCovered::new(fleet) };
        let recorder = fleet.then(|| ctx.address().recipient());
        let pass = Grant::shadow(
            info,
            (finished, out),
            (verdict.clone(), recorder.clone()),
            self.config.cancelled_call_hold(),
        );
        let name = self.name().to_owned();
        metrics::shadow_call(&name);
        if covered {
            self.shadow.let_retry_through();
            actix::spawn(retry_without_ghost(self.shadow.clone(), finish));
            let _ = reply.send(Ok(pass));
            return None;
        }
        self.shadow.let_through();
        let (ghost_reply, granted) = oneshot::channel();
        // Counted until it is done: a drain (shutdown) waits for it, and hurries it.
        let holds = self.shadow.holds();
        let times = (asked, Instant::now());
        let told = verdict.clone();
        let ghost_of = (wave, verdict, holds, recorder);
        actix::spawn(ghost(name, self.shadow.clone(), times, ghost_of, granted, finish));
        // A caller gone already drops the pass; its ghost still runs, as the call would have.
        let _ = reply.send(Ok(pass));
        Some((ghost_reply, told))
    }

    /// After a live change: the callers waiting in a class that runs in shadow now go at
    /// once with a pass, as a call in shadow does; each one's place in the queue becomes its
    /// ghost's, whose wait counts from when the caller asked.
    pub(super) fn let_waiting_through(&mut self, ctx: &Context<Self>) {
        if self.config.shadow().is_off() {
            return;
        }
        let config = &self.config;
        let enforced: Vec<_> = self
            .waiters
            .iter_mut()
            .filter(|w| w.ghost.is_none() && !w.reply.is_closed() && config.is_shadow(w.class))
            .map(|w| {
                // A placeholder until the ghost's reply takes its place, below.
                let reply = std::mem::replace(&mut w.reply, oneshot::channel().0);
                (w.id.clone(), reply, w.tenant, w.tokens, w.class, w.enqueued)
            })
            .collect();
        for (id, reply, tenant, tokens, class, asked) in enforced {
            let Some((ghost, verdict)) = self.let_through(reply, (tenant, tokens), class, asked, false, ctx) else {
                continue;
            };
            // It waited already: not granted at once.
            verdict.ghost_answered(false);
            if let Some(waiter) = self.waiters.get_mut(&id) {
                waiter.reply = ghost;
                waiter.ghost = Some(verdict);
            }
        }
    }

    /// Whether other schedulers may call the provider too, their calls not in this one's
    /// count: other schedulers of this process at its in-process gate; any other process while
    /// the store is shared (one that started a moment ago is counted by the heartbeats only a
    /// second later, and a fleet starting together would take the provider's refusals of each
    /// other's calls for the limit's until then); and, the store out of reach, other processes
    /// as the last heartbeat counted them.
    fn in_fleet(&self) -> bool {
        let processes = self.fleet_size.load(std::sync::atomic::Ordering::Relaxed);
        self.local.members() > 1 || self.mode == Mode::Shared || (self.mode != Mode::Local && processes > 1)
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

impl Handler<FleetReport> for Lane {
    type Result = ();

    fn handle(&mut self, report: FleetReport, ctx: &mut Context<Self>) {
        let span = span_on(self.clock, report.went, report.ended);
        let signal = match report.met {
            FleetMet::Went { served } => WaveSignal::Went { span, served },
            FleetMet::RateLimited { retry_after } => WaveSignal::RateLimitedAmong { retry_after, span },
            FleetMet::Served { at_most } => WaveSignal::ServedSuccess { at_most, span: Some(span) },
        };
        // As a release (its id, a pass's, holds nothing): the reply's wave reaches the gauges,
        // the metrics and the tally, a cut in fallback is carried to the store at the rejoin,
        // and a drain waits for it. One lost (the store unreachable) teaches less: nothing more.
        let release = Release {
            id: report.id,
            wave: report.wave,
            signal,
            token_delta: 0.into(),
            registration_only: true,
            fleet_record: true,
            window: None,
        };
        self.release(release, 0, ctx);
    }
}

/// A call that went at `went` and ended at `ended`, on the engine's clock (the in-process
/// gate's; the store's glue moves it to the store's clock as it sends it: `store::finish`).
fn span_on(clock: EngineClock, went: Instant, ended: Instant) -> ServedSpan {
    ServedSpan { went_ms: clock.ms_at(went), ended_ms: clock.ms_at(ended) }
}

/// How long after a 429 in a fleet its judgement waits while no call has succeeded yet to
/// tell how long calls take.
const UNKNOWN_SUCCESS_HOLD: std::time::Duration = std::time::Duration::from_secs(1);

/// Bounds of that wait once calls have succeeded: at least the records' travel to the store,
/// at most half the record's keep (`wavegate_core::SERVED_SPANS_KEEP_MS`), so that the calls
/// beside a 429 are still in it.
const JUDGED_AFTER_LEAST: std::time::Duration = std::time::Duration::from_millis(50);
const JUDGED_AFTER_MOST: std::time::Duration = std::time::Duration::from_secs(30);

/// A retry let through without a ghost (its call's first ghost stands for it): a success
/// teaches how long calls that succeed take.
async fn retry_without_ghost(tally: ShadowTally, finish: oneshot::Receiver<Box<ShadowFinish>>) {
    let started = Instant::now();
    if let Ok(finish) = finish.await
        && finish.result == CallResult::Success
    {
        tally.succeeded_in(finish.ended.saturating_duration_since(started));
    }
}

/// A call's ghost — its caller asked at `asked`, its call went at `started` (the same time,
/// but for a caller let through when shadow was switched on while it waited) in wave `wave`
/// as the lane saw it: waits for the permit the call would have waited for (`granted`),
/// records the wait or the refusal, then holds the permit as long as enforcing would have
/// held it (`finish` says how the call ended) and releases it with what enforcing would have
/// met:
///
/// * a 429 or a failure with no more of this process's calls at the provider than the limit
///   lets through (`shadow::enforcing_meets_failure`; a failure in a fleet, where the other
///   processes' calls are not counted, with its ghost granted at once): as it came, held as
///   long as the call took (enforcing would have met it and retried; the retry has a ghost of
///   its own) — but nothing to learn when the wave has moved on since the call went (a 429 of
///   the same burst cut it: enforcing's would have been late);
/// * a 429 in a fleet: as one enforcing would not have met (below), and, with its ghost
///   granted at once in the same wave, judged later, once the calls beside it have ended
///   and been recorded (`FleetReport`): the gate learns from it only when the fleet's calls
///   at the provider beside it leave it within the limit (`WaveSignal::RateLimitedAmong`);
/// * one with more: enforcing would have held those back and this call would most likely
///   have succeeded, so the ghost holds as long as calls that succeed take and reports
///   nothing to learn (the call's retries go without a ghost);
/// * a success: as a success while the provider served no more calls at once than it is known
///   to have served while this one ran (`WaveSignal::ServedSuccess`): ghosts that waited hold
///   their permits later than their calls ran, and a success counted with the ghosts' permits
///   could take a limit the provider never served for one that held. In a fleet the success
///   carries its span, and the gate counts the fleet's served calls beside it (`ServedSpans`).
///
/// `holds` counts the ghost until it is done. A ghost started before a drain (the process
/// shutting down) releases its permit as soon as its call has ended, not a hold later.
async fn ghost(
    name: String,
    tally: ShadowTally,
    (asked, started): (Instant, Instant),
    (wave, verdict, holds, fleet): (u64, RetryCovered, GhostHolds, Option<Recipient<FleetReport>>),
    granted: oneshot::Receiver<Result<Grant, Error>>,
    finish: oneshot::Receiver<Box<ShadowFinish>>,
) {
    let mut grant = match granted.await {
        Ok(Ok(grant)) => grant,
        Ok(Err(error)) => {
            verdict.ghost_answered(false);
            metrics::shadow_refused(&name, error.code());
            tally.refused(error.code());
            // Counted at the provider until it ends.
            let _ = finish.await;
            return;
        }
        // The lane stopped with the scheduler.
        Err(_) => {
            verdict.ghost_answered(false);
            return;
        }
    };
    grant.mark_received();
    verdict.ghost_answered(grant.info().at_once);
    let at = Instant::now();
    let waited = at.saturating_duration_since(asked);
    metrics::shadow_wait(&name, waited);
    tally.granted(waited);
    // The pass always reports (its drop does); a missing report means the scheduler stopped.
    let Ok(finish) = finish.await else { return };
    let took = finish.ended.saturating_duration_since(started);
    let failed = is_failure(finish.signal, finish.result);
    // In a fleet, a 429 is judged by the fleet's calls at the provider beside it (this
    // process counts only its own), once they have ended (below): its verdict is set (its
    // ghost stands for the whole call, and holds as long as a success takes).
    // Known now: the ghost's answer came before the call's end was read.
    let (held, failure) = match (failed, verdict.get()) {
        // Not enforcing's failure: the call would have succeeded.
        (true, true) => (tally.success_hold().unwrap_or(took), Some((WaveSignal::Neutral, CallResult::Ignored))),
        // Enforcing's failure, of a wave left since: late, as enforcing's would have been.
        (true, false) if grant.info().wave != wave => (took, Some((WaveSignal::Neutral, finish.result))),
        (true, false) => (took, Some((finish.signal, finish.result))),
        (false, _) => {
            if finish.result == CallResult::Success {
                tally.succeeded_in(took);
            }
            (took, None)
        }
    };
    // The process shutting down does not wait the rest of the hold: the call has ended, and
    // a permit released after the scheduler stopped would stay held in the store until its
    // lease ends.
    {
        let hold = std::pin::pin!(tokio::time::sleep_until(clock::after(at, held)));
        let hurried = std::pin::pin!(tally.hurried(&holds));
        futures_util::future::select(hold, hurried).await;
    }
    let report = |met: FleetMet, wave: u64| FleetReport {
        id: finish.pass.clone(),
        wave,
        went: started,
        ended: finish.ended,
        met,
    };
    let (success, judged) = match (finish.signal, fleet) {
        // In a fleet, a success is judged later too, once the calls served beside it have
        // ended and been recorded (some were still at the provider when it ended); its ghost
        // releases with nothing to learn.
        (WaveSignal::Success, Some(lane)) => {
            let met = FleetMet::Served { at_most: finish.served };
            (WaveSignal::Neutral, Some((lane, report(met, grant.info().wave))))
        }
        (WaveSignal::Success, None) => (WaveSignal::ServedSuccess { at_most: finish.served, span: None }, None),
        // Enforcing would have sent a 429 only with its ghost granted at once, in the same wave.
        (signal, Some(lane)) => match signal.rate_limited() {
            Some(retry_after) if grant.info().at_once && grant.info().wave == wave => {
                (signal, Some((lane, report(FleetMet::RateLimited { retry_after }, wave))))
            }
            _ => (signal, None),
        },
        (signal, None) => (signal, None),
    };
    let met = failure.unwrap_or((success, finish.result));
    grant.finish_late(*finish, waited, met);
    if let Some((lane, report)) = judged {
        // Once the calls beside it have ended and been recorded: half as long again as the
        // longest call that succeeded took, from its end (a second before any succeeded). A
        // drain meanwhile (the process shutting down) drops it: nothing is written after.
        let after = tally.longest_success().map_or(UNKNOWN_SUCCESS_HOLD, |longest| {
            (longest + longest / 2).clamp(JUDGED_AFTER_LEAST, JUDGED_AFTER_MOST)
        });
        let judged = std::pin::pin!(tokio::time::sleep_until(clock::after(report.ended, after)));
        let hurried = std::pin::pin!(tally.hurried(&holds));
        if let futures_util::future::Either::Left(_) = futures_util::future::select(judged, hurried).await {
            lane.do_send(report);
        }
    }
    // Its release is in the lane's mailbox now: a drain that waited for it sees it there.
    drop(holds);
}
