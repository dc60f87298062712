//! The per-upstream supervisor actor: circuit breaker and retry budget.
//!
//! Every attempt asks it first ([`Admit`]), before a permit is asked for, so a broken
//! upstream or a spent budget costs no permit and no Redis round trip.

use actix::{Actor, Context, Handler};
use std::time::Duration;

use wavegate_core::{BreakerTicket, CircuitBreaker, Clock, MonotonicClock, RetryBudget, UpstreamConfig};

use crate::messages::{Admit, AttemptKind, ReadBreaker, Record, Refusal};

/// One upstream's breaker and retry budget.
#[derive(Debug)]
pub(crate) struct UpstreamSupervisor {
    breaker: CircuitBreaker,
    budget: RetryBudget,
    clock: MonotonicClock,
}

impl UpstreamSupervisor {
    pub(crate) fn new(config: &UpstreamConfig, clock: MonotonicClock) -> Self {
        Self {
            breaker: CircuitBreaker::new(*config.breaker()),
            budget: RetryBudget::new(*config.retry_budget()),
            clock,
        }
    }
}

impl Actor for UpstreamSupervisor {
    type Context = Context<Self>;
}

impl Handler<Admit> for UpstreamSupervisor {
    type Result = Result<BreakerTicket, Refusal>;

    fn handle(&mut self, admit: Admit, _: &mut Context<Self>) -> Self::Result {
        let now = self.clock.now_ms();
        // The budget is checked before the breaker so a refused retry does not take a
        // half-open probe slot.
        if admit.kind == AttemptKind::AfterTransient && self.budget.remaining(now) < 1.0 {
            return Err(Refusal::BudgetSpent);
        }
        let ticket = self
            .breaker
            .admit(now)
            .map_err(|open| Refusal::BreakerOpen(Duration::from_millis(open.retry_at_ms.saturating_sub(now))))?;
        match admit.kind {
            AttemptKind::First => self.budget.deposit(now),
            AttemptKind::AfterTransient => {
                self.budget.try_withdraw(now);
            }
            AttemptKind::AfterRateLimit => {}
        }
        Ok(ticket)
    }
}

impl Handler<Record> for UpstreamSupervisor {
    type Result = ();

    fn handle(&mut self, record: Record, _: &mut Context<Self>) {
        self.breaker.record(record.ticket, record.result, self.clock.now_ms());
    }
}

impl Handler<ReadBreaker> for UpstreamSupervisor {
    type Result = actix::MessageResult<ReadBreaker>;

    fn handle(&mut self, _: ReadBreaker, _: &mut Context<Self>) -> Self::Result {
        actix::MessageResult(self.breaker.state())
    }
}
