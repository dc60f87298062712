//! The permit guard: capacity that goes back on drop, and an explicit outcome report.

use std::time::{Duration, Instant};

use actix::Addr;
use std::sync::Arc;

use wavegate_core::{BreakerTicket, CallResult, Outcome, WaveSignal, WaveState, WindowReport};

use crate::coordinator::Coordinator;
use crate::messages::{Finish, Grant, Record};
use crate::quota::QuotaBlock;
use crate::supervisor::UpstreamSupervisor;

/// A permit to make one call to an upstream.
///
/// Report how the call went with [`report`](Permit::report) (or [`succeeded`](Permit::succeeded));
/// that releases the permit, feeds the shared wave (a 429 cuts the limit for the whole fleet)
/// and the upstream's circuit breaker. A permit dropped without a report is released as a
/// neutral outcome: capacity is never lost, but nothing is learned either.
#[must_use = "a permit holds capacity until it is reported or dropped"]
#[derive(Debug)]
pub struct Permit {
    inner: Option<Held>,
}

#[derive(Debug)]
struct Held {
    upstream: usize,
    name: String,
    granted_at: Instant,
    grant: Grant,
    /// Tokens reserved at acquire.
    tokens: u64,
    ticket: BreakerTicket,
    coordinator: Addr<Coordinator>,
    supervisor: Addr<UpstreamSupervisor>,
    quota: QuotaRef,
}

/// An upstream's spent-quota refusal, and how long a spent quota sets it for.
#[derive(Debug, Clone)]
pub(crate) struct QuotaRef {
    pub(crate) block: Arc<QuotaBlock>,
    pub(crate) pause: Duration,
}

/// Where a permit reports to.
#[derive(Debug)]
pub(crate) struct Owners {
    pub(crate) coordinator: Addr<Coordinator>,
    pub(crate) supervisor: Addr<UpstreamSupervisor>,
    pub(crate) quota: QuotaRef,
}

impl Permit {
    pub(crate) fn new(
        upstream: usize,
        name: String,
        grant: Grant,
        tokens: u64,
        ticket: BreakerTicket,
        owners: Owners,
    ) -> Self {
        let Owners { coordinator, supervisor, quota } = owners;
        let granted_at = Instant::now();
        let held = Held { upstream, name, granted_at, grant, tokens, ticket, coordinator, supervisor, quota };
        Self { inner: Some(held) }
    }

    fn held(&self) -> &Held {
        self.inner.as_ref().expect("a permit is held until it is consumed")
    }

    /// The wave the permit was issued in (its 429 is reported against this wave).
    pub fn wave(&self) -> u64 {
        self.held().grant.wave
    }

    /// The wave state when the permit was granted.
    pub fn state(&self) -> WaveState {
        self.held().grant.state
    }

    /// The limit when the permit was granted.
    pub fn limit(&self) -> u32 {
        self.held().grant.limit
    }

    /// The permit's id (unique across the fleet).
    pub fn id(&self) -> &str {
        &self.held().grant.id
    }

    /// How long the caller waited for this permit in all: [`queue_wait`](Self::queue_wait)
    /// plus [`permit_wait`](Self::permit_wait).
    pub fn waited(&self) -> Duration {
        self.queue_wait() + self.permit_wait()
    }

    /// How long the caller waited behind other callers of this process.
    pub fn queue_wait(&self) -> Duration {
        self.held().grant.queue_wait
    }

    /// How long the caller waited at the head of the queue for the limit or a cooldown.
    pub fn permit_wait(&self) -> Duration {
        self.held().grant.permit_wait
    }

    /// Tokens reserved for this permit at acquire.
    pub fn reserved_tokens(&self) -> u64 {
        self.held().tokens
    }

    /// Reports the call's outcome and releases the permit. The token reservation is kept as
    /// the usage, except for a 429 or another 4xx, which the provider did not process: those
    /// give it back. Use [`report_usage`](Self::report_usage) when the usage is known.
    ///
    /// What the provider said comes along: "R left until T" holds the fleet's grants until T
    /// once nothing is left, a spent quota refuses the upstream in this process (see
    /// [`ErrorKind::QuotaExhausted`](crate::ErrorKind::QuotaExhausted)), unreadable signals are counted.
    pub fn report(self, outcome: Outcome) {
        let unprocessed = matches!(outcome, Outcome::RateLimited { .. } | Outcome::ClientError { .. });
        let actual = if unprocessed { 0 } else { self.reserved_tokens() };
        self.report_usage(outcome, actual);
    }

    /// Reports the call's outcome and the tokens it really used, and releases the permit:
    /// the difference with the reservation is refunded or charged to the tokens budget.
    pub fn report_usage(mut self, outcome: Outcome, tokens: u64) {
        if let Some(held) = &self.inner {
            crate::provider_signals::observe(&held.name, &outcome, &held.quota.block, held.quota.pause);
        }
        let window = outcome.window_report();
        self.finish(outcome.wave_signal(), outcome.breaker_result(), Some(outcome.label()), tokens, window);
    }

    /// Reports a success (using the reserved tokens) and releases the permit.
    pub fn succeeded(mut self) {
        let reserved = self.reserved_tokens();
        self.finish(WaveSignal::Success, CallResult::Success, Some("success"), reserved, None);
    }

    fn finish(
        &mut self,
        signal: WaveSignal,
        result: CallResult,
        outcome: Option<&'static str>,
        tokens_used: u64,
        window: Option<WindowReport>,
    ) {
        if let Some(held) = self.inner.take() {
            let used = i64::try_from(tokens_used).unwrap_or(i64::MAX);
            let token_delta = used - i64::try_from(held.tokens).unwrap_or(0);
            if let Some(outcome) = outcome {
                crate::metrics::upstream_call(&held.name, outcome, held.granted_at.elapsed());
            }
            held.supervisor.do_send(Record { ticket: held.ticket, result });
            held.coordinator.do_send(Finish {
                upstream: held.upstream,
                id: held.grant.id,
                wave: held.grant.wave,
                signal,
                token_delta,
                window,
                tokens_reserved: held.tokens,
            });
        }
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        // Usage unknown: the reservation stands.
        let reserved = self.inner.as_ref().map_or(0, |held| held.tokens);
        self.finish(WaveSignal::Neutral, CallResult::Ignored, None, reserved, None);
    }
}

/// A breaker admission not yet turned into a permit: handed back as "ignored" if the permit
/// never comes (wait too long, queue full, caller gone), so a half-open probe slot is not lost.
#[derive(Debug)]
pub(crate) struct Admission {
    ticket: Option<BreakerTicket>,
    supervisor: Addr<UpstreamSupervisor>,
}

impl Admission {
    pub(crate) fn new(ticket: BreakerTicket, supervisor: Addr<UpstreamSupervisor>) -> Self {
        Self { ticket: Some(ticket), supervisor }
    }

    /// The ticket, now owned by a permit.
    pub(crate) fn into_ticket(mut self) -> BreakerTicket {
        self.ticket.take().expect("the ticket is taken once")
    }
}

impl Drop for Admission {
    fn drop(&mut self) {
        if let Some(ticket) = self.ticket.take() {
            self.supervisor.do_send(Record { ticket, result: CallResult::Ignored });
        }
    }
}
