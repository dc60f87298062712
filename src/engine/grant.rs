//! A granted permit as the engine hands it out: a guard that goes back to its lane however its
//! caller ends.
//!
//! The lane sends the [`Grant`] itself to the waiting caller. If the caller is gone by then (its
//! future dropped while it waited, or between the grant and its next poll), the grant is
//! dropped with the channel, and its `Drop` gives the permit back at once: no grant is ever
//! lost in a channel. Once the caller has sent its request to the provider
//! ([`mark_in_service`](Grant::mark_in_service)), a grant dropped without an outcome (the
//! caller's future was cancelled mid-call) keeps its permit until the provider has plausibly
//! finished — its call timeout, or the upstream's `cancelled_call_hold` — because the limit
//! protects what the provider is serving, not what the caller still waits for.

use std::time::Duration;

use actix::{Message, Recipient};
use tokio::sync::oneshot;
use wavegate_core::{
    BreakerTicket, CallResult, PermitId, TokenDelta, WaveSignal, WaveState, WindowReport, WindowsBack,
};

use super::clock::{self, Instant};
use crate::served::CallOut;
use crate::shadow::{RetryCovered, is_failure};

/// Release permit `id` and report its outcome (to the wave, the budgets, the breaker).
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub(crate) struct Finish {
    pub(crate) id: PermitId,
    pub(crate) wave: u64,
    pub(crate) signal: WaveSignal,
    /// The breaker's ticket of the attempt and how the attempt went.
    pub(crate) breaker: Option<(BreakerTicket, CallResult)>,
    /// Tokens used beyond the reservation (negative: fewer), in all and of the output.
    pub(crate) token_delta: TokenDelta,
    /// What the response said is left of the provider's windows, if anything.
    pub(crate) window: Option<WindowReport>,
    /// Tokens the call reserved (the others in flight are assumed to reserve as much).
    pub(crate) tokens_reserved: u64,
    /// The call was cancelled while its request was at the provider: the permit stays held
    /// until then.
    pub(crate) hold_until: Option<Instant>,
}

/// What a call in shadow met at the provider, in a fleet, for the fleet's counts: the lane
/// reports it to the gate in charge (nothing held: the id's permit, if any, is released).
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub(crate) struct FleetReport {
    /// The pass's id.
    pub(crate) id: PermitId,
    /// The wave the call went in (a 429).
    pub(crate) wave: u64,
    /// When the call went to the provider and its answer ended.
    pub(crate) went: Instant,
    pub(crate) ended: Instant,
    pub(crate) met: FleetMet,
}

/// What the call of a [`FleetReport`] met.
#[derive(Debug, Clone, Copy)]
pub(crate) enum FleetMet {
    /// It ended, `served` or not (refused, failed): recorded as it ends (`WaveSignal::Went`),
    /// so that what the other processes' calls met counts it before its ghost reports.
    Went { served: bool },
    /// A 429, reported once the calls served beside it have ended and been recorded: the
    /// limit's to learn from only if they leave it within the limit
    /// (`WaveSignal::RateLimitedAmong`).
    RateLimited { retry_after: Option<Duration> },
    /// A success, reported once the calls served beside it have ended and been recorded (some
    /// were still at the provider when it ended): it counts them (`WaveSignal::ServedSuccess`
    /// with its span), `at_most` being what this process saw served at once.
    Served { at_most: u32 },
}

/// How a call in shadow ended, for its ghost: the ghost reports it when the permit the call
/// would have held is released (`lane/shadow.rs`).
#[derive(Debug)]
pub(crate) struct ShadowFinish {
    /// The pass's id (the call's record in a fleet's counts).
    pub(crate) pass: PermitId,
    pub(crate) signal: WaveSignal,
    pub(crate) result: CallResult,
    pub(crate) tokens_used: TokensUsed,
    pub(crate) window: Option<WindowReport>,
    /// When the call ended.
    pub(crate) ended: Instant,
    /// The most of this process's calls the provider is known to have served at once while
    /// this one was there, itself included (`CallOut::end`).
    pub(crate) served: u32,
    /// The call was cancelled while its request was at the provider: held until then.
    pub(crate) hold_until: Option<Instant>,
}

/// Where a grant's release goes.
#[derive(Debug)]
enum Sink {
    /// The lane that granted it.
    Lane(Recipient<Finish>),
    /// The ghost of a call in shadow (the grant is a pass: nothing was taken). `out` counts
    /// the call at the provider until it ends; `covered` says whether the call's retries go
    /// without a ghost (see [`Grant::shadow_covers_retry`]).
    Ghost {
        ghost: Option<oneshot::Sender<Box<ShadowFinish>>>,
        out: Option<CallOut>,
        covered: RetryCovered,
        /// In a fleet: the lane, told when the provider served the call (`FleetReport`).
        served: Option<Recipient<FleetReport>>,
    },
}

/// What a grant says about the permit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct GrantInfo {
    pub(crate) id: PermitId,
    pub(crate) wave: u64,
    pub(crate) state: WaveState,
    pub(crate) limit: u32,
    /// Time in the local queue behind other waiters.
    pub(crate) queue_wait: Duration,
    /// Time at the head of the queue until the limit (or a cooldown) let it through.
    pub(crate) permit_wait: Duration,
    /// Tokens reserved.
    pub(crate) tokens: u64,
    /// Of them, the answer's output (the output budget).
    pub(crate) output: u64,
    /// Granted without waiting: nobody waited in this process when it asked, and the first
    /// ask for it was granted.
    pub(crate) at_once: bool,
}

impl GrantInfo {
    /// What a gate's grant says, before the lane adds the waits.
    /// `(tokens, output)`: what the grant reserved, in all and of the output.
    pub(crate) fn granted(id: PermitId, wave: u64, state: WaveState, limit: u32, (tokens, output): (u64, u64)) -> Self {
        let (queue_wait, permit_wait) = (Duration::ZERO, Duration::ZERO);
        Self { id, wave, state, limit, queue_wait, permit_wait, tokens, output, at_once: false }
    }
}

/// The tokens a call used, as far as it is known.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TokensUsed {
    /// In all only: the input is taken to be as reserved ([`TokenDelta::of_total`]).
    Total(u64),
    /// The provider said both parts: (input, output).
    Parts(u64, u64),
    /// The provider refused the call (a 429) and counted none of it: the whole reservation
    /// comes back to the budgets, and to the provider's windows as it says
    /// ([`TokenDelta::refused`]).
    Refused(WindowsBack),
}

impl From<u64> for TokensUsed {
    fn from(total: u64) -> Self {
        TokensUsed::Total(total)
    }
}

impl TokensUsed {
    /// What is settled against `reserved` (in all, of the output).
    pub(crate) fn delta(self, (tokens, output): (u64, u64)) -> TokenDelta {
        match self {
            TokensUsed::Total(used) => {
                let signed = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
                TokenDelta::of_total(signed(used) - signed(tokens), output)
            }
            TokensUsed::Parts(input, used_output) => TokenDelta::of_usage((tokens, output), (input, used_output)),
            TokensUsed::Refused(windows) => TokenDelta::refused((tokens, output), windows),
        }
    }
}

/// A granted permit: released when finished or dropped (see the module docs).
#[derive(Debug)]
#[must_use = "a grant holds a permit until it is finished or dropped"]
pub(crate) struct Grant {
    info: GrantInfo,
    sink: Sink,
    ticket: Option<BreakerTicket>,
    /// How long a permit whose request was sent stays held after its call was cancelled.
    hold: Duration,
    /// The caller has it (a grant dropped before gives its whole reservation back).
    received: bool,
    /// When the caller sent its request, if it has.
    in_service_since: Option<Instant>,
    done: bool,
}

impl Grant {
    pub(crate) fn new(info: GrantInfo, lane: Recipient<Finish>, ticket: Option<BreakerTicket>, hold: Duration) -> Self {
        Self { info, sink: Sink::Lane(lane), ticket, hold, received: false, in_service_since: None, done: false }
    }

    /// A pass for a call in shadow, counted at the provider by `out` until it ends: it holds
    /// nothing; its release goes to `ghost` (its ghost, or the task that follows a retry
    /// without one), which reports it in its time. `covered`: see
    /// [`shadow_covers_retry`](Self::shadow_covers_retry).
    /// In a fleet, `served` (the lane) records the call's span as soon as the provider served
    /// it, for the fleet's counts.
    pub(crate) fn shadow(
        info: GrantInfo,
        (ghost, out): (oneshot::Sender<Box<ShadowFinish>>, CallOut),
        (covered, served): (RetryCovered, Option<Recipient<FleetReport>>),
        hold: Duration,
    ) -> Self {
        let sink = Sink::Ghost { ghost: Some(ghost), out: Some(out), covered, served };
        Self { info, sink, ticket: None, hold, received: false, in_service_since: None, done: false }
    }

    /// Whether it is a pass of shadow mode.
    pub(crate) fn is_shadow(&self) -> bool {
        matches!(self.sink, Sink::Ghost { .. })
    }

    /// For a pass: what says, once it is released, whether a retry after it goes without a
    /// ghost of its own — its failure was one enforcing would not have met (more calls were
    /// at the provider than the limit lets through, `shadow::enforcing_meets_failure`), or it
    /// was a retry that had none already. Enforcing would not have retried: the call's first
    /// ghost stands for the whole call.
    pub(crate) fn shadow_covers_retry(&self) -> Option<RetryCovered> {
        match &self.sink {
            Sink::Ghost { covered, .. } => Some(covered.clone()),
            Sink::Lane(_) => None,
        }
    }

    /// Releases the permit as the call in shadow `finish` ended, `late` later than the call
    /// (the ghost was granted that much after the call started), with what the ghost judged
    /// enforcing would have met (`lane/shadow.rs`).
    pub(crate) fn finish_late(mut self, finish: ShadowFinish, late: Duration, met: (WaveSignal, CallResult)) {
        let hold_until = finish.hold_until.map(|until| clock::after(until, late));
        self.send(met.0, met.1, finish.tokens_used, finish.window, hold_until);
    }

    /// The caller has taken the grant out of its channel.
    pub(crate) fn mark_received(&mut self) {
        self.received = true;
    }

    pub(crate) fn info(&self) -> &GrantInfo {
        &self.info
    }

    /// The caller is sending its request to the provider now: from here on, a cancelled
    /// call keeps its permit until the provider has plausibly finished.
    /// A pass (shadow) counts its call at the provider from here, not from when it was let
    /// through.
    pub(crate) fn mark_in_service(&mut self) {
        if self.in_service_since.is_some() {
            return;
        }
        self.in_service_since = Some(Instant::now());
        if let Sink::Ghost { out: Some(out), .. } = &mut self.sink {
            out.sent();
        }
    }

    /// Releases the permit with the call's outcome.
    pub(crate) fn finish(
        mut self,
        signal: WaveSignal,
        result: CallResult,
        tokens_used: impl Into<TokensUsed>,
        window: Option<WindowReport>,
    ) {
        self.send(signal, result, tokens_used.into(), window, None);
    }

    fn send(
        &mut self,
        signal: WaveSignal,
        result: CallResult,
        tokens_used: TokensUsed,
        window: Option<WindowReport>,
        hold_until: Option<Instant>,
    ) {
        if std::mem::replace(&mut self.done, true) {
            return;
        }
        let lane = match &mut self.sink {
            Sink::Lane(lane) => lane,
            Sink::Ghost { ghost, out, covered, served: lane } => {
                let failed = is_failure(signal, result);
                let went = out.as_ref().map(CallOut::went);
                let served = out.take().map_or(0, |out| out.end(!failed));
                if failed {
                    covered.failed(served, self.info.limit, signal.rate_limited().is_some());
                }
                let ended = Instant::now();
                if let (Some(lane), Some(went)) = (lane.as_ref(), went) {
                    let met = FleetMet::Went { served: result == CallResult::Success };
                    lane.do_send(FleetReport { id: self.info.id.clone(), wave: 0, went, ended, met });
                }
                let finish = ShadowFinish {
                    pass: self.info.id.clone(),
                    signal,
                    result,
                    tokens_used,
                    window,
                    ended,
                    hold_until,
                    served: u32::try_from(served).unwrap_or(u32::MAX),
                };
                // A ghost refused or gone has nothing to report.
                if let Some(ghost) = ghost.take() {
                    let _ = ghost.send(Box::new(finish));
                }
                return;
            }
        };
        let token_delta = tokens_used.delta((self.info.tokens, self.info.output));
        // The lane is gone only when the scheduler stopped: nothing is left to give back to.
        lane.do_send(Finish {
            id: self.info.id.clone(),
            wave: self.info.wave,
            signal,
            breaker: self.ticket.take().map(|ticket| (ticket, result)),
            token_delta,
            window,
            tokens_reserved: self.info.tokens,
            hold_until,
        });
    }
}

impl Drop for Grant {
    fn drop(&mut self) {
        // No outcome: nothing learned. A grant its caller never took gives its reservation
        // back; otherwise the reservation stands (usage unknown). A request at the provider
        // keeps its permit until it has plausibly finished there.
        let hold_until = self.in_service_since.map(|since| clock::after(since, self.hold));
        let used = if self.received { self.info.tokens } else { 0 };
        self.send(WaveSignal::Neutral, CallResult::Ignored, TokensUsed::Total(used), None, hold_until);
    }
}
