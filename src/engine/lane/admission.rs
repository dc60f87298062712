//! The one admission check: every attempt is checked here, once, before it waits.
//!
//! In order: a class the upstream does not have, an estimate above the configured tokens burst
//! (it never fits in any mode), a spent quota, the retry budget (a retry after a transient
//! failure), the circuit breaker, then what holds only now: an estimate above the burst in
//! force (a learned limit, the class's share; in fallback the fleet's, not the share's), a
//! full queue; last, a wait bound that what the lane knows proves cannot be met
//! (`deadline.rs`: told at once, with the time it would have needed). A request refused here
//! never waits and never costs a gate call; one admitted takes its breaker ticket
//! into the queue (given back as "ignored" if no permit comes).

use actix::{AsyncContext, Context};
use std::time::Duration;
use wavegate_core::{BreakerTicket, CallResult, Clock, PermitId};

use super::actor::Lane;
use super::deadline::HOPELESS_MARGIN;
use super::messages::Acquire;
use super::waiters::Waiter;
use crate::engine::clock::Instant;
use crate::engine::request::{AttemptKind, ClassRef, Request};
use crate::error::{Budget, Error};
use crate::metrics;

impl Lane {
    /// Checks `acquire` and queues it, or answers it with the refusal.
    pub(super) fn admit(&mut self, acquire: Acquire, ctx: &mut Context<Self>) {
        let Acquire { request, kind, wait_until, reply } = acquire;
        // In shadow the caller goes at once; its ghost is admitted and waits in its place.
        let ghost = self.shadow_class(&request);
        let covered = request.shadow_covered;
        let (reply, verdict) = match ghost {
            Some(class) => {
                let tokens = (request.tenant, request.tokens);
                match self.let_through(reply, tokens, class, Instant::now(), covered, ctx) {
                    Some((ghost, verdict)) => (ghost, Some(verdict)),
                    // A retry its call's ghost stands for: nothing to admit.
                    None => return,
                }
            }
            None => (reply, None),
        };
        let (class, ticket) = match self.check(&request, kind) {
            Ok(admitted) => admitted,
            Err(error) => {
                let _ = reply.send(Err(error));
                return;
            }
        };
        let now = Instant::now();
        let cost = (request.tokens, request.output.min(request.tokens));
        let proven = self.proven_until(cost, self.reserved().as_ref());
        if let Some((until, reason)) = proven.filter(|(until, _)| *until > wait_until + HOPELESS_MARGIN) {
            // What this lane knows (a cooldown, a spent window, a budget without room) proves
            // no permit can come before this caller's wait bound: it is told now, with the time
            // it would have needed, not at its deadline (`deadline.rs`).
            self.refuse_hopeless(ticket, reply, until.saturating_duration_since(Instant::now()), reason);
            return;
        }
        // A denial heard a while ago would refuse it: the store is asked now, not at the next
        // look, so its answer (the same denial, or an operator's clear) comes in one round trip.
        let recheck = self.heard_would_refuse(cost, wait_until);
        self.sequence += 1;
        let class_name = self.config.classes().get(class).map(|c| c.name());
        // Without classes a tenant is fair in this process only, and not part of the id.
        let tenant = request.tenant.filter(|_| class_name.is_some());
        let id = PermitId::new(class_name, &self.instance, self.sequence, tenant);
        let alone = self.waiters.len() == 0;
        let held_back = self.blocked_until.is_some_and(|until| until > now) || self.reconciling || self.switching;
        if let Some(verdict) = verdict.as_ref().filter(|_| !alone || held_back) {
            // Behind others, or the lane asks nothing now (a cooldown, a budget's wait, a
            // change of mode): not granted at once, whenever it is.
            verdict.ghost_answered(false);
        }
        self.waiters.push(Waiter {
            alone,
            ghost: verdict,
            id: id.clone(),
            enqueued: now,
            deadline: wait_until,
            reply,
            tokens: request.tokens,
            output: request.output.min(request.tokens),
            class,
            tenant: request.tenant,
            ticket: Some(ticket),
            at_head: None,
            deadline_timer: None,
        });
        let depth = self.waiters.len();
        self.gauges.queue(self.config.name().as_str(), depth);
        self.record_classes();
        if recheck {
            self.blocked_until = None;
        }
        self.pump(ctx);
        // Still waiting (not granted at once): answered at its deadline at the latest.
        if let Some(waiter) = self.waiters.get_mut(&id) {
            let after = wait_until.saturating_duration_since(Instant::now());
            waiter.deadline_timer = Some(ctx.run_later(after, |act, ctx| act.expire(ctx)));
        }
    }

    /// The class an admitted request waits in, and its breaker ticket; or why it is refused.
    /// The order is the one callers have always seen: a class or an estimate that can never
    /// work, a spent quota, the retry budget, the breaker, then what only holds now (the burst
    /// in force, a full queue; these give the breaker's ticket back).
    fn check(&mut self, request: &Request, kind: AttemptKind) -> Result<(usize, BreakerTicket), Error> {
        // A half-open probe slot held by a caller that left the queue is free again.
        self.give_back_abandoned_tickets();
        let name = self.config.name().as_str();
        let class = match &request.class {
            ClassRef::Default => self.config.default_class(),
            ClassRef::Named(class) => match self.config.class_index(class) {
                Some(index) => index,
                None => {
                    let known = self.config.classes().iter().map(|c| c.name().to_owned()).collect();
                    return Err(Error::unknown_class(name, class.as_ref(), known));
                }
            },
        };
        // Never fits the configured burst, in any mode.
        if let Some(budget) = self.config.budgets().tokens
            && request.tokens > u64::from(budget.burst())
        {
            let burst = u64::from(budget.burst());
            return Err(Error::insufficient_capacity(name, Budget::TokensPerMinute, request.tokens, burst));
        }
        let output = request.output.min(request.tokens);
        let parts = [
            (self.config.budgets().input, request.tokens - output, Budget::InputTokensPerMinute),
            (self.config.budgets().output, output, Budget::OutputTokensPerMinute),
        ];
        for (budget, part, which) in parts {
            if let Some(budget) = budget
                && part > u64::from(budget.burst())
            {
                return Err(Error::insufficient_capacity(name, which, part, u64::from(budget.burst())));
            }
        }
        if let Some(budget) = self.config.budgets().tokens_per_day
            && request.tokens > budget.burst()
        {
            return Err(Error::insufficient_capacity(name, Budget::TokensPerDay, request.tokens, budget.burst()));
        }
        if let Some(retry_after) = self.quota.remaining() {
            return Err(Error::quota_exhausted(name, 0, retry_after));
        }
        let now = self.clock.now_ms();
        // The budget before the breaker, so a refused retry does not take a half-open probe slot.
        if kind == AttemptKind::AfterTransient && self.retry_budget.remaining(now) < 1.0 {
            metrics::retry_budget_refused(name);
            metrics::overload_refused(name, "retry_budget_spent");
            return Err(Error::retry_budget_spent(name, 0, "transient"));
        }
        let ticket = self.observe_breaker(|breaker| breaker.admit(now)).map_err(|open| {
            let name = self.config.name().as_str();
            metrics::overload_refused(name, "breaker_open");
            Error::breaker_open(name, Duration::from_millis(open.retry_at_ms.saturating_sub(now)))
        })?;
        // Refused before any wait: it would only block those queued behind it.
        let refusal = self.never_fits(request.tokens, class).or_else(|| {
            let capacity = self.config.queue_capacity().get();
            (self.waiters.len() >= capacity).then(|| {
                metrics::overload_refused(self.config.name().as_str(), "queue_full");
                Error::queue_full(self.config.name().as_str(), capacity)
            })
        });
        if let Some(error) = refusal {
            self.observe_breaker(|breaker| breaker.record(ticket, CallResult::Ignored, now));
            return Err(error);
        }
        match kind {
            AttemptKind::First => self.retry_budget.deposit(now),
            AttemptKind::AfterTransient => {
                self.retry_budget.try_withdraw(now);
            }
            AttemptKind::AfterRateLimit => {}
        }
        Ok((class, ticket))
    }

    /// Runs `change` on the breaker and records the state change it made, if any.
    pub(super) fn observe_breaker<T>(&mut self, change: impl FnOnce(&mut wavegate_core::CircuitBreaker) -> T) -> T {
        let before = self.breaker.state().as_str();
        let result = change(&mut self.breaker);
        let after = self.breaker.state().as_str();
        if before != after {
            tracing::info!(upstream = %self.name(), from = before, to = after, "circuit breaker");
            metrics::breaker(self.name(), Some(before), after);
        }
        result
    }

    /// The tokens burst in force for `class`, and the budget it comes from: the upstream's
    /// (configured, tightened by a tokens limit the provider announced), or a capped class's
    /// own share when smaller (the gate's rule). In fallback it is the fleet's too, not this
    /// process's share of it: an estimate above the share's burst is admitted in debt
    /// (`wavegate_core::LocalGate::fallback`, rule 7).
    fn tokens_burst(&self, class: usize) -> Option<(u64, Budget)> {
        let now_ms = self.clock.now_ms();
        let upstream = self.local.tokens_burst(None, now_ms)?;
        match self.local.tokens_burst(Some(class), now_ms) {
            Some(own) if own < upstream => Some((own, Budget::ClassShare)),
            _ => Some((upstream, Budget::TokensPerMinute)),
        }
    }

    /// The refusal of an estimate that can never fit the tokens burst in force for `class`.
    pub(super) fn never_fits(&self, tokens: u64, class: usize) -> Option<Error> {
        let (burst, budget) = self.tokens_burst(class)?;
        (tokens > burst).then(|| Error::insufficient_capacity(self.config.name().as_str(), budget, tokens, burst))
    }
}
