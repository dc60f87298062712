//! The per-upstream supervisor actor: circuit breaker and retry budget.
//!
//! Every attempt asks it first ([`Admit`]), before a permit is asked for, so a broken
//! upstream or a spent budget costs no permit and no Redis round trip.

use actix::{Actor, AsyncContext, Context, Handler};
use std::time::Duration;

use wavegate_core::{CircuitBreaker, Clock, MonotonicClock, RetryBudget, UpstreamConfig};

use crate::messages::{Admit, AttemptKind, ReadBreaker, Record, Refusal};
use crate::metrics;
use crate::permit::Admission;

/// One upstream's breaker and retry budget.
#[derive(Debug)]
pub(crate) struct UpstreamSupervisor {
    name: String,
    breaker: CircuitBreaker,
    budget: RetryBudget,
    clock: MonotonicClock,
}

impl UpstreamSupervisor {
    pub(crate) fn new(config: &UpstreamConfig, clock: MonotonicClock) -> Self {
        Self {
            name: config.name().to_string(),
            breaker: CircuitBreaker::new(*config.breaker()),
            budget: RetryBudget::new(*config.retry_budget()),
            clock,
        }
    }

    /// Runs `change` on the breaker and records the state change it made, if any.
    fn observe<T>(&mut self, change: impl FnOnce(&mut CircuitBreaker) -> T) -> T {
        let before = self.breaker.state().as_str();
        let result = change(&mut self.breaker);
        let after = self.breaker.state().as_str();
        if before != after {
            tracing::info!(upstream = %self.name, from = before, to = after, "circuit breaker");
            metrics::breaker(&self.name, Some(before), after);
        }
        result
    }
}

impl Actor for UpstreamSupervisor {
    type Context = Context<Self>;

    fn started(&mut self, _: &mut Context<Self>) {
        metrics::breaker(&self.name, None, self.breaker.state().as_str());
    }
}

impl Handler<Admit> for UpstreamSupervisor {
    /// The ticket comes back inside its guard, made here: if the caller has gone away by the
    /// time the answer arrives (or drops it before it owns a permit), dropping the guard gives
    /// the ticket back, so a half-open probe slot is never lost.
    type Result = Result<Admission, Refusal>;

    fn handle(&mut self, admit: Admit, ctx: &mut Context<Self>) -> Self::Result {
        let now = self.clock.now_ms();
        // The budget is checked before the breaker so a refused retry does not take a
        // half-open probe slot.
        if admit.kind == AttemptKind::AfterTransient && self.budget.remaining(now) < 1.0 {
            metrics::retry_budget_refused(&self.name);
            metrics::overload_refused(&self.name, "retry_budget_spent");
            return Err(Refusal::BudgetSpent);
        }
        let ticket = self.observe(|breaker| breaker.admit(now)).map_err(|open| {
            metrics::overload_refused(&self.name, "breaker_open");
            Refusal::BreakerOpen(Duration::from_millis(open.retry_at_ms.saturating_sub(now)))
        })?;
        match admit.kind {
            AttemptKind::First => self.budget.deposit(now),
            AttemptKind::AfterTransient => {
                self.budget.try_withdraw(now);
            }
            AttemptKind::AfterRateLimit => {}
        }
        Ok(Admission::new(ticket, ctx.address()))
    }
}

impl Handler<Record> for UpstreamSupervisor {
    type Result = ();

    fn handle(&mut self, record: Record, _: &mut Context<Self>) {
        let now = self.clock.now_ms();
        self.observe(|breaker| breaker.record(record.ticket, record.result, now));
    }
}

impl Handler<ReadBreaker> for UpstreamSupervisor {
    type Result = actix::MessageResult<ReadBreaker>;

    fn handle(&mut self, _: ReadBreaker, _: &mut Context<Self>) -> Self::Result {
        actix::MessageResult(self.breaker.state())
    }
}
