//! The acquire loop: serve the heads of the queue, one gate call at a time.
//!
//! A denial says why, and the loop sleeps accordingly: until the end of a COOLDOWN (plus a
//! little jitter, so the fleet does not ask at one instant), until a budget has room, or at the
//! limit until a release wakes it, with a slow poll as a safety net. A grant goes to the waiter
//! it names; a denial that can never turn into a grant (an estimate above the burst) fails the
//! waiter it names, and only that one.

use std::time::Duration;

use actix::{ActorFutureExt, AsyncContext, Context, WrapFuture};
use rand::Rng;
use wavegate_core::{Ask, Clock, Decision, DenyReason, duration_ms};

use super::actor::{Held, Lane};
use super::messages::StoreTrouble;
use super::waiters::{Waiter, Waiters};
use crate::engine::clock::Instant;
use crate::engine::gate::{Answer, Gate};
use crate::engine::grant::{Grant, GrantInfo};
use crate::engine::store::{self, StoreError};
use crate::engine::wake::{Handed, HandedBy};
use crate::error::{Budget, Error};
use crate::metrics;
use crate::status::Mode;

/// How long to wait before asking again at the limit when no release is announced.
const AT_LIMIT_POLL: (Duration, Duration) = (Duration::from_millis(250), Duration::from_millis(500));
/// How long to wait before asking again after a store error that is not an outage.
const STORE_ERROR_RETRY: (Duration, Duration) = (Duration::from_millis(50), Duration::from_millis(150));
/// The longest a lane waits for the coordinator's switch after reporting an outage.
const SWITCH_BOUND: Duration = Duration::from_secs(1);
/// Spread added to a budget's exact wait, so processes do not ask at one instant.
const BUDGET_JITTER: (Duration, Duration) = (Duration::ZERO, Duration::from_millis(5));
/// The most jitter added to the end of a cooldown.
const COOLDOWN_JITTER: Duration = Duration::from_millis(50);
/// The longest a lane refused by the provider's window waits before it looks at the window
/// again: another process's answer may have shortened it, or an operator cleared it.
const WINDOW_LOOK_AGAIN: Duration = Duration::from_secs(1);
/// The longest a lane refused by a tokens budget (tokens, input or output) waits before it asks
/// again, when the upstream settles to the usage: the calls running elsewhere in the fleet give
/// back what they did not use when they end, and the wait the store told was computed without
/// it. (A refund in this process asks again at once.)
const TOKENS_LOOK_AGAIN: Duration = Duration::from_millis(500);
/// How far back this process's own grants are remembered for its next fallback's budgets (the
/// budgets are per minute), and at most how many.
const RECENT_GRANTS: (Duration, usize) = (Duration::from_secs(60), 4_096);

/// A duration drawn uniformly from `[low, high]`.
fn jittered((low, high): (Duration, Duration)) -> Duration {
    low + (high - low).mul_f64(rand::rng().random::<f64>())
}

impl Lane {
    /// Serves the heads of the queue: in a loop while the gate answers at once, else with one
    /// gate call in flight.
    pub(super) fn pump(&mut self, ctx: &mut Context<Self>) {
        loop {
            self.expire(ctx);
            self.give_back_abandoned_tickets();
            if self.reconciling || self.switching {
                return;
            }
            if self.pumping {
                self.wake_pending = true;
                return;
            }
            let now = Instant::now();
            if self.blocked_until.is_some_and(|until| until > now) {
                // The retry timer fires then; asking before would only be refused.
                return;
            }
            if self.over_rejoin_cap(now, ctx) {
                return;
            }
            let classes = !self.config.classes().is_empty();
            let asks: Vec<Ask> = if classes {
                // The gate chooses among the heads of every class (and tenant).
                self.waiters.heads(now)
            } else {
                let head = self.waiters.head_of(0, now);
                head.map(|w| Ask { id: w.id.clone(), tokens: w.tokens, output: w.output, waiting: 1 })
                    .into_iter()
                    .collect()
            };
            let asked = asks.clone();
            let lease = self.config.permit_ttl();
            // One gate call at a time: its grant tells which waiter was asked for the first
            // time (shadow mode), a denial's wait counts from its decision, no earlier than now
            // (`deadline.rs`).
            self.asked_at = now;
            self.asked_at_ms = self.clock.now_ms();
            let Some(answer) = self.gate.acquire(&self.instance, asks, lease, self.asked_at_ms) else { return };
            if let Some(timer) = self.retry_timer.take() {
                ctx.cancel_future(timer);
            }
            match answer {
                Answer::Now(result) => {
                    if !self.on_acquired(result, &asked, ctx) {
                        return;
                    }
                }
                Answer::Later(call) => {
                    let epoch = self.epoch;
                    self.acquires_sent += 1;
                    self.pumping = true;
                    self.wake_pending = false;
                    ctx.spawn(call.into_actor(self).map(move |result, act, ctx| {
                        if epoch != act.epoch {
                            act.stale_acquire(result, asked, ctx);
                            return;
                        }
                        act.pumping = false;
                        if act.on_acquired(result, &asked, ctx) || act.wake_pending {
                            act.pump(ctx);
                        }
                        act.answer_drains();
                    }));
                    return;
                }
            }
        }
    }

    /// Just back in shared mode: the shared set does not hold the permits of processes still
    /// in their fallback yet, so this process stays within its fallback share until they are
    /// back too. A release here, or the end of it, asks again.
    fn over_rejoin_cap(&mut self, now: Instant, ctx: &mut Context<Self>) -> bool {
        let Some((until, share)) = self.rejoin_cap else { return false };
        if now >= until || !self.gate.is_shared() {
            self.rejoin_cap = None;
            return false;
        }
        if self.held.len() < share {
            return false;
        }
        self.retry_in(until - now, ctx);
        true
    }

    /// A reply that came after a change of mode: the loop already went on without it. Unless it
    /// is a denial, the store may hold a registration of an asked id (a grant, or a script that
    /// ran after its reply was given up on): drop it once the store is back, unless the waiter
    /// holds the same id by then.
    fn stale_acquire(&mut self, result: Result<Decision, StoreError>, asked: Vec<Ask>, ctx: &mut Context<Self>) {
        match result {
            Ok(Decision::Denied { .. }) => {}
            Ok(Decision::Granted { id, .. }) => {
                let reserved = asked.iter().find(|ask| ask.id == id).map_or((0, 0), |ask| (ask.tokens, ask.output));
                self.drop_registration(id, reserved, ctx);
            }
            Err(_) => {
                // At most one of several heads asked for can have been charged, and which is
                // unknown: refund none rather than all.
                let several = asked.len() > 1;
                for ask in asked {
                    self.drop_registration(ask.id, if several { (0, 0) } else { (ask.tokens, ask.output) }, ctx);
                }
            }
        }
    }

    /// Applies a gate's answer to an acquire; returns whether the next waiter may be served now.
    fn on_acquired(&mut self, result: Result<Decision, StoreError>, asked: &[Ask], ctx: &mut Context<Self>) -> bool {
        // The ghosts asked for and not granted now are not granted at once (shadow mode's
        // verdicts; `grant` tells the one granted).
        let granted = match &result {
            Ok(Decision::Granted { id, .. }) => Some(id),
            _ => None,
        };
        for ask in asked.iter().filter(|ask| Some(&ask.id) != granted) {
            if let Some(verdict) = self.waiters.get_mut(&ask.id).and_then(|w| w.ghost.as_ref()) {
                verdict.ghost_answered(false);
            }
        }
        match result {
            Ok(decision) => self.on_decision(decision, asked, ctx),
            Err(error) => {
                // In an outage the script may have run although its reply was lost: drop the
                // registration when the store is back, unless the waiter holds the same id by
                // then (then it is adopted). Any other error is asked again with the same id,
                // which is idempotent.
                if error.is_outage() {
                    self.outage.unreleased.extend(asked.iter().map(|ask| ask.id.clone()));
                    // The store charged its day budgets if it granted one of them: counted as
                    // used (the largest ask), so the fallback's day share does not hand it out
                    // again. A refusal so counted costs a share one request, never the day.
                    if self.has_day_budget() {
                        let tokens = asked.iter().map(|ask| ask.tokens).max().unwrap_or(0);
                        self.day_usage.granted(
                            self.day_word(),
                            false,
                            tokens,
                            self.config.budgets(),
                            self.clock.now_ms(),
                        );
                    }
                }
                self.on_store_error(self.epoch, "acquire", error, ctx);
                false
            }
        }
    }

    fn on_decision(&mut self, decision: Decision, asked: &[Ask], ctx: &mut Context<Self>) -> bool {
        let now = Instant::now();
        self.last_shared.in_flight = Some((decision.in_flight(), now));
        match decision {
            Decision::Granted { id, .. } if self.held.contains_key(&id) => {
                // A release handed this permit already (the hand-off raced this ask with the
                // same id): it is the same permit, held and given to its waiter once.
                true
            }
            Decision::Granted { id, wave, state, limit, .. } => {
                self.nothing_holds_back();
                let reserved = asked.iter().find(|ask| ask.id == id).map_or((0, 0), |ask| (ask.tokens, ask.output));
                self.grant(GrantInfo::granted(id, wave, state, limit, reserved), true, ctx);
                true
            }
            Decision::Denied { reason: DenyReason::Cooldown, retry_after_ms, in_flight, .. } => {
                let rest = Duration::from_millis(retry_after_ms);
                self.cooldown_until = Some(now + rest);
                if self.mode == Mode::Shared {
                    self.last_shared.cooldown_until = Some(now + rest);
                }
                let jitter = COOLDOWN_JITTER.mul_f64(rand::rng().random::<f64>());
                self.block_until(rest + jitter, ctx);
                // Those whose wait bound comes before the cooldown's end are told now.
                self.hear(DenyReason::Cooldown, retry_after_ms, (0, 0), in_flight);
                self.refuse_proven_hopeless(ctx);
                false
            }
            Decision::Denied { reason: DenyReason::AtLimit, retry_after_ms, .. } => {
                // A release wakes the loop; the poll is a safety net (or, when the gate said
                // when a capped class has room, that time).
                let after = if retry_after_ms > 0 {
                    Duration::from_millis(retry_after_ms) + jittered(BUDGET_JITTER)
                } else {
                    jittered(AT_LIMIT_POLL)
                };
                self.retry_in(after, ctx);
                false
            }
            Decision::Denied { id, reason: DenyReason::TokensExceedBurst, .. } => {
                // Only the waiter it names: its estimate does not fit the burst in force now
                // (e.g. a limit learned since it was admitted).
                if let Some(waiter) = self.waiters.take(&id) {
                    // The store's view (a limit it learned) may be tighter than this process's.
                    let error = self.never_fits(waiter.tokens, waiter.class).unwrap_or_else(|| {
                        let name = self.config.name().as_str();
                        Error::insufficient_capacity(name, Budget::TokensPerMinute, waiter.tokens, 0)
                    });
                    self.fail(waiter, error, ctx);
                }
                true
            }
            Decision::Denied { id, reason, retry_after_ms, in_flight } => {
                // A rate budget or the provider's window says exactly when there is room; a
                // window is looked at again at a bounded pace (it may be shortened or cleared).
                let exact = Duration::from_millis(retry_after_ms);
                let wait = if reason == DenyReason::ProviderWindow {
                    self.window_until = Some(now + exact);
                    exact.min(WINDOW_LOOK_AGAIN)
                } else if reason == DenyReason::TokenBudget && !self.config.keeps_estimate() {
                    exact.min(TOKENS_LOOK_AGAIN)
                } else {
                    exact
                } + jittered(BUDGET_JITTER);
                tracing::trace!(upstream = self.name(), reason = reason.as_str(), ?wait, "budget");
                metrics::budget_wait(self.name(), reason.as_str());
                self.block_until(wait, ctx);
                // What it proves (`deadline.rs`): those who cannot make it are told now.
                let cost = asked.iter().find(|ask| ask.id == id).map_or((0, 0), |ask| (ask.tokens, ask.output));
                self.hear(reason, retry_after_ms, cost, in_flight);
                self.refuse_proven_hopeless(ctx);
                // The ask it answered was refused as hopeless: the next head (now or later) may
                // ask for fewer tokens, or another part, and fit now; the room that was told is
                // that ask's, so nobody waits for it.
                if reason == DenyReason::TokenBudget && self.waiters.get_mut(&id).is_none() {
                    self.blocked_until = None;
                    if let Some(timer) = self.retry_timer.take() {
                        ctx.cancel_future(timer);
                    }
                    return self.waiters.len() > 0;
                }
                false
            }
        }
    }

    /// Takes a permit a release granted to this lane's last ask at the limit (the hand-off):
    /// to its waiter, as a grant of that ask would have; back at once when the waiter is gone.
    /// A permit this lane holds already (its ask with the same id came first) is not taken
    /// twice. One handed by a gate no longer in charge: the store's is given back when the
    /// store is reachable (as a registration whose reply was lost), a former in-process gate's
    /// is gone with it.
    pub(super) fn take_handed(&mut self, handed: Handed, ctx: &mut Context<Self>) {
        let in_charge = match (&self.gate, handed.by) {
            (Gate::Shared(_), HandedBy::Store) => true,
            (Gate::Local(gate), HandedBy::Local(number)) => gate.number() == number,
            _ => false,
        };
        if !in_charge || self.reconciling {
            if handed.by == HandedBy::Store {
                self.drop_registration(handed.id, (0, 0), ctx);
            }
            return;
        }
        if self.held.contains_key(&handed.id) {
            return;
        }
        let Some(waiter) = self.waiters.get_mut(&handed.id) else {
            // Its caller left (or its permit came and went already): the store's goes back as
            // a registration nobody holds (without the warning of a lease that ended under a
            // call), the in-process gate's as any permit whose caller is gone.
            if handed.by == HandedBy::Store {
                self.drop_registration(handed.id, (0, 0), ctx);
            } else {
                self.grant(GrantInfo::granted(handed.id, handed.wave, handed.state, handed.limit, (0, 0)), false, ctx);
            }
            return;
        };
        let reserved = (waiter.tokens, waiter.output);
        metrics::permit_handed(self.name());
        self.nothing_holds_back();
        let info = GrantInfo::granted(handed.id, handed.wave, handed.state, handed.limit, reserved);
        self.grant(info, false, ctx);
    }

    /// The gate granted a permit (to an ask, or handed on): no cooldown, budget or provider
    /// window holds this lane back any more, and what a denial proved is stale.
    fn nothing_holds_back(&mut self) {
        self.cooldown_until = None;
        self.blocked_until = None;
        self.window_until = None;
        self.heard = None;
    }

    /// Hands the permit of `info` to its waiter (or back, when the waiter is gone). `asked`: the
    /// grant answers this lane's last ask (a handed permit does not: its waiter waited, so it
    /// was not granted at once, whatever its place).
    fn grant(&mut self, mut info: GrantInfo, asked: bool, ctx: &mut Context<Self>) {
        let now = Instant::now();
        let now_ms = self.clock.now_ms();
        let class = self.class_of(&info.id);
        // Held from now on, whoever takes it: a waiter gone meanwhile releases it through its
        // grant's drop, like any other.
        self.held.insert(info.id.clone(), Held { wave: info.wave, class, holding: None, tokens: info.tokens });
        if self.mode == Mode::Shared {
            self.last_shared.state = Some((info.state, info.limit));
            self.last_shared.wave = info.wave;
        }
        self.remember_grant(now_ms, (info.tokens, info.output));
        if self.mode == Mode::Fallback {
            self.outage.used(self.config.budgets(), now_ms, 1, i64::try_from(info.tokens).unwrap_or(i64::MAX));
        }
        let me = ctx.address().recipient();
        let Some(mut waiter) = self.waiters.take(&info.id) else {
            // The caller gave up while the gate was asked: its grant goes straight back.
            drop(Grant::new(info, me, None, Duration::ZERO));
            return;
        };
        if let Some(timer) = waiter.deadline_timer.take() {
            ctx.cancel_future(timer);
        }
        self.waiters.granted(&waiter);
        info.at_once = asked && waiter.alone && waiter.at_head == Some(self.asked_at);
        self.pace.granted(waiter.class, now);
        let at_head = waiter.at_head.unwrap_or(now);
        info.queue_wait = at_head.saturating_duration_since(waiter.enqueued);
        info.permit_wait = now.saturating_duration_since(at_head);
        let name = self.config.name().as_str();
        metrics::permit_granted(name, info.queue_wait, info.permit_wait);
        self.tally.granted(info.queue_wait + info.permit_wait);
        if let Some(class) = self.config.classes().get(waiter.class) {
            metrics::class_granted(name, class.name(), info.queue_wait + info.permit_wait);
        }
        self.gauges.local(name, self.held.len());
        self.gauges.queue(name, self.waiters.len());
        self.gauges.wave(name, info.state, info.limit, info.wave);
        let hold = self.config.cancelled_call_hold();
        let grant = Grant::new(info, me, waiter.ticket.take(), hold);
        if let Some(retry_after) = self.quota.remaining() {
            // The quota ran out while this caller waited: the permit goes back unused.
            drop(grant);
            let error = Error::quota_exhausted(self.config.name().as_str(), 0, retry_after);
            let _ = waiter.reply.send(Err(error));
        } else {
            // A caller that is gone by now drops the grant with the channel: it comes back.
            let _ = waiter.reply.send(Ok(grant));
        }
        self.record_classes();
    }

    /// Remembers a grant for the next fallback's budgets (when there are rate budgets).
    fn remember_grant(&mut self, now_ms: u64, (tokens, output): (u64, u64)) {
        let (budgets, _, _) = self.local.budgets(now_ms);
        if budgets == wavegate_core::Budgets::default() {
            return;
        }
        let (memory, most) = RECENT_GRANTS;
        let since = now_ms.saturating_sub(duration_ms(memory));
        while self.recent_grants.front().is_some_and(|(at, _, _)| *at < since) || self.recent_grants.len() >= most {
            self.recent_grants.pop_front();
        }
        self.recent_grants.push_back((now_ms, tokens, output));
        if budgets.requests_per_day.is_some() || budgets.tokens_per_day.is_some() {
            // A shared grant's reply said the day after charging it; a fallback's grant is this
            // process's alone.
            self.day_usage.granted(
                self.day_word(),
                self.mode == Mode::Shared,
                tokens,
                self.config.budgets(),
                self.clock.now_ms(),
            );
        }
    }

    /// Answers a waiter with `error`; its breaker ticket goes back unused.
    pub(super) fn fail(&mut self, mut waiter: Waiter, error: Error, ctx: &mut Context<Self>) {
        if let Some(timer) = waiter.deadline_timer.take() {
            ctx.cancel_future(timer);
        }
        self.give_back_ticket(&mut waiter);
        let _ = waiter.reply.send(Err(error));
    }

    /// Drops the waiters whose caller went away and gives their breaker tickets back.
    pub(super) fn give_back_abandoned_tickets(&mut self) {
        self.waiters.purge_gone();
        let abandoned = self.waiters.take_abandoned_tickets();
        if abandoned.is_empty() {
            return;
        }
        let now = self.clock.now_ms();
        for ticket in abandoned {
            self.observe_breaker(|breaker| breaker.record(ticket, wavegate_core::CallResult::Ignored, now));
        }
    }

    fn give_back_ticket(&mut self, waiter: &mut Waiter) {
        if let Some(ticket) = waiter.ticket.take() {
            let now = self.clock.now_ms();
            self.observe_breaker(|breaker| breaker.record(ticket, wavegate_core::CallResult::Ignored, now));
        }
    }

    /// Asks again in `after`, and not before: nothing can be admitted until then.
    fn block_until(&mut self, after: Duration, ctx: &mut Context<Self>) {
        self.blocked_until = Some(crate::engine::clock::after(Instant::now(), after));
        self.retry_in(after, ctx);
    }

    pub(super) fn retry_in(&mut self, after: Duration, ctx: &mut Context<Self>) {
        if let Some(timer) = self.retry_timer.take() {
            ctx.cancel_future(timer);
        }
        self.retry_timer = Some(ctx.run_later(after, |act, ctx| {
            act.retry_timer = None;
            act.blocked_until = None;
            act.switching = false;
            act.pump(ctx);
        }));
    }

    /// A store call made under `epoch` failed: an outage is the coordinator's to switch (this
    /// lane stops asking the store until it has); anything else is logged and asked again later.
    pub(super) fn on_store_error(
        &mut self,
        epoch: u64,
        command: &'static str,
        error: StoreError,
        ctx: &mut Context<Self>,
    ) {
        if epoch != self.epoch {
            return;
        }
        metrics::redis_error(command, error.label());
        if error.is_outage() {
            self.switching = true;
            let trouble = StoreTrouble { upstream: self.upstream, epoch, command, error };
            self.coordinator.do_send(trouble);
            // Should the switch never come (a coordinator that is gone), ask again anyway.
            self.retry_in(SWITCH_BOUND, ctx);
        } else {
            tracing::error!(upstream = %self.name(), command, %error, "shared store error");
            self.retry_in(jittered(STORE_ERROR_RETRY), ctx);
        }
    }

    /// Answers the waiters whose deadline has passed.
    pub(super) fn expire(&mut self, ctx: &mut Context<Self>) {
        let now = Instant::now();
        let expired = self.waiters.take_expired(now);
        if expired.is_empty() {
            return;
        }
        // When the caller could try again: the end of the cooldown or of the provider's window
        // that holds the grants back, whichever is later.
        let retry_after = [self.cooldown_until, self.window_until]
            .into_iter()
            .flatten()
            .filter(|until| *until > now)
            .max()
            .map(|until| until - now);
        let depth = self.waiters.len();
        self.gauges.queue(self.config.name().as_str(), depth);
        for mut waiter in expired {
            if !waiter.reply.is_closed() {
                metrics::overload_refused(self.name(), "waited_too_long");
            }
            let error = Waiters::timed_out(&waiter, self.name(), now, retry_after);
            if let Some(timer) = waiter.deadline_timer.take() {
                ctx.cancel_future(timer);
            }
            self.give_back_ticket(&mut waiter);
            let _ = waiter.reply.send(Err(error));
        }
    }
}

impl Lane {
    /// When the store last said what is left of the day budgets (kept through fallbacks).
    pub(super) fn day_word(&self) -> Option<std::time::Instant> {
        self.shared.as_deref().and_then(store::day_left).map(|(_, at)| at)
    }

    /// Whether the upstream has a day budget now.
    pub(super) fn has_day_budget(&self) -> bool {
        let (budgets, _, _) = self.local.budgets(self.clock.now_ms());
        budgets.requests_per_day.is_some() || budgets.tokens_per_day.is_some()
    }
}
