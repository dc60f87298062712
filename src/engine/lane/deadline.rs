//! Deadlines that refuse early: a caller whose wait bound (its deadline, or the upstream's
//! `max_wait`) comes before the earliest a permit can come, as proved by what this lane
//! knows, is told at once with the time it would have needed — at its ask, and when a gate's
//! denial proves it for callers already waiting.
//!
//! What proves it (`wavegate_core::Hold`; the rules are `wavegate_core`'s `deadline` module):
//! a cooldown the gate told of; in shared mode, the store's last denial
//! (`wavegate_core::HeardDenial`: the fleet's budgets and windows as last read); in local mode
//! and a fallback, the in-process gate itself (`LocalGate::proven_hold`), the tokens budget
//! with every token this lane's permits reserved counted as refundable. The queue ahead is
//! not a proof (callers ahead may leave, and a later caller with an earlier deadline goes
//! first): it feeds only the status's expected wait.

use std::collections::HashMap;
use std::time::Duration;

use actix::Context;
use tokio::sync::oneshot;
use wavegate_core::{BreakerTicket, CallResult, Clock, DenyReason, HeardDenial, Hold, LearnedBudgets, PermitId};

use super::actor::Lane;
use crate::engine::clock::Instant;
use crate::engine::grant::Grant;
use crate::error::Error;
use crate::metrics;

/// How long a gate's denial, as heard, refuses callers at admission by itself. Past it, a
/// caller it would refuse is queued and the store asked again at once (not at the lane's next
/// look): a window an operator cleared, or a budget changed, meanwhile is seen, and the
/// refusal, if it still holds, comes one round trip later. It bounds those extra asks to ten a
/// second per upstream and process.
pub(super) const HEARD_FRESH: Duration = Duration::from_millis(100);

/// How far past a caller's wait bound the earliest permit must lie for the caller to be
/// refused at once: clocks are read in milliseconds, and a bound that meets the earliest
/// permit is not hopeless.
pub(super) const HOPELESS_MARGIN: Duration = Duration::from_millis(10);

impl Lane {
    /// The tokens each permit this lane holds reserved, by id (what settlements may refund),
    /// when the in-process gate is in charge (the only case that needs them).
    pub(super) fn reserved(&self) -> Option<HashMap<&str, u64>> {
        let local = !self.gate.is_shared();
        local.then(|| self.held.iter().map(|(id, held)| (id.as_str(), held.tokens)).collect())
    }

    /// When a permit for an estimate of `tokens` (`output` of them the answer's) can come at
    /// the earliest, as proved (`None`: nothing proves it cannot come now), and what holds it
    /// back. `reserved` is [`reserved`](Self::reserved)'s.
    pub(super) fn proven_until(
        &self,
        (tokens, output): (u64, u64),
        reserved: Option<&HashMap<&str, u64>>,
    ) -> Option<(Instant, DenyReason)> {
        let now = Instant::now();
        let now_ms = self.clock.now_ms();
        let cooldown = self.cooldown_until.filter(|until| *until > now).map(|until| (until, DenyReason::Cooldown));
        let heard = self.heard_proof(now_ms, (tokens, output), true);
        // The in-process gate is the one in charge outside shared mode: it proves what it holds.
        let gate = reserved.and_then(|reserved| self.local.proven_hold(tokens, reserved, now_ms));
        // A hold in the gate's milliseconds (a truncated reading of now) ends at an exact one.
        let held = Hold::latest(heard, gate)
            .map(|hold| (self.clock.instant_at(now_ms.saturating_add(hold.wait_ms)), hold.reason));
        [cooldown, held].into_iter().flatten().max_by_key(|(until, _)| *until)
    }

    /// What the gate's last denial, as heard under this epoch, proves for an ask of `tokens`,
    /// if it was heard within [`HEARD_FRESH`] (`fresh`) or before (`!fresh`).
    fn heard_proof(&self, now_ms: u64, (tokens, output): (u64, u64), fresh: bool) -> Option<Hold> {
        let (epoch, heard) = self.heard?;
        let recent = now_ms.saturating_sub(heard.at_ms) <= wavegate_core::duration_ms(HEARD_FRESH);
        (epoch == self.epoch && recent == fresh).then(|| heard.proves(now_ms, tokens, output)).flatten()
    }

    /// Whether the gate's last denial, heard too long ago to refuse by itself, would refuse an
    /// ask of `tokens` bound by `wait_until`: the store is to be asked again at once.
    pub(super) fn heard_would_refuse(&self, cost: (u64, u64), wait_until: Instant) -> bool {
        let now_ms = self.clock.now_ms();
        self.heard_proof(now_ms, cost, false).is_some_and(|hold| {
            self.clock.instant_at(now_ms.saturating_add(hold.wait_ms)) > wait_until + HOPELESS_MARGIN
        })
    }

    /// Keeps a gate's denial of an ask of `tokens` (see `HeardDenial`), with whether a limit
    /// learned from the provider may be in force. Its wait counts from when the ask was sent:
    /// the store decided no earlier, so the end is never placed later than it is.
    pub(super) fn hear(&mut self, reason: DenyReason, wait_ms: u64, (tokens, output): (u64, u64), in_flight: u32) {
        let now_ms = self.clock.now_ms();
        let learned = self.local.budgets(now_ms).2 != LearnedBudgets::default();
        let at_ms = self.asked_at_ms.min(now_ms);
        let heard = HeardDenial { reason, at_ms, wait_ms, tokens, output, in_flight, learned };
        self.heard = Some((self.epoch, heard));
    }

    /// Refuses a caller no permit can reach before its wait bound, told at once with the time
    /// it would have needed; its breaker ticket goes back unused.
    pub(super) fn refuse_hopeless(
        &mut self,
        ticket: BreakerTicket,
        reply: oneshot::Sender<Result<Grant, Error>>,
        needed: Duration,
        reason: DenyReason,
    ) {
        let now_ms = self.clock.now_ms();
        self.observe_breaker(|breaker| breaker.record(ticket, CallResult::Ignored, now_ms));
        metrics::overload_refused(self.name(), "waited_too_long");
        metrics::refused_early(self.name(), reason.as_str());
        let _ = reply.send(Err(Error::refused_early(self.name(), Duration::ZERO, needed)));
    }

    /// Answers now the waiters whose wait bound comes before the earliest a permit can reach
    /// them, as proved (called when a gate's denial brings news): each is told the time it
    /// would have needed.
    pub(super) fn refuse_proven_hopeless(&mut self, ctx: &mut Context<Self>) {
        let reserved = self.reserved();
        let mut hopeless: Vec<(PermitId, Instant, DenyReason)> = Vec::new();
        for waiter in self.waiters.iter() {
            if let Some((until, reason)) = self.proven_until((waiter.tokens, waiter.output), reserved.as_ref())
                && until > waiter.deadline + HOPELESS_MARGIN
            {
                hopeless.push((waiter.id.clone(), until, reason));
            }
        }
        drop(reserved);
        if hopeless.is_empty() {
            return;
        }
        let now = Instant::now();
        for (id, until, reason) in hopeless {
            let Some(waiter) = self.waiters.take(&id) else { continue };
            if !waiter.reply.is_closed() {
                metrics::overload_refused(self.name(), "waited_too_long");
                metrics::refused_early(self.name(), reason.as_str());
            }
            let waited = now.saturating_duration_since(waiter.enqueued);
            let error = Error::refused_early(self.name(), waited, until.saturating_duration_since(now));
            self.fail(waiter, error, ctx);
        }
        self.gauges.queue(self.config.name().as_str(), self.waiters.len());
        self.record_classes();
    }
}
