//! The permit guard: capacity that goes back on drop, and an explicit outcome report.

use std::time::{Duration, Instant};

use actix::Addr;
use wavegate_core::{BreakerTicket, CallResult, Outcome, WaveSignal, WaveState};

use crate::coordinator::Coordinator;
use crate::messages::{Finish, Grant, Record};
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
    ticket: BreakerTicket,
    coordinator: Addr<Coordinator>,
    supervisor: Addr<UpstreamSupervisor>,
}

impl Permit {
    pub(crate) fn new(
        upstream: usize,
        name: String,
        grant: Grant,
        ticket: BreakerTicket,
        coordinator: Addr<Coordinator>,
        supervisor: Addr<UpstreamSupervisor>,
    ) -> Self {
        Self {
            inner: Some(Held { upstream, name, granted_at: Instant::now(), grant, ticket, coordinator, supervisor }),
        }
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

    /// Reports the call's outcome and releases the permit.
    pub fn report(mut self, outcome: Outcome) {
        self.finish(outcome.wave_signal(), outcome.breaker_result(), Some(outcome.label()));
    }

    /// Reports a success and releases the permit.
    pub fn succeeded(mut self) {
        self.finish(WaveSignal::Success, CallResult::Success, Some("success"));
    }

    fn finish(&mut self, signal: WaveSignal, result: CallResult, outcome: Option<&'static str>) {
        if let Some(held) = self.inner.take() {
            if let Some(outcome) = outcome {
                crate::metrics::upstream_call(&held.name, outcome, held.granted_at.elapsed());
            }
            held.supervisor.do_send(Record { ticket: held.ticket, result });
            held.coordinator.do_send(Finish {
                upstream: held.upstream,
                id: held.grant.id,
                wave: held.grant.wave,
                signal,
            });
        }
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        self.finish(WaveSignal::Neutral, CallResult::Ignored, None);
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
