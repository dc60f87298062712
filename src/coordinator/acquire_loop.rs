//! The acquire loop of one upstream: serve the head of the FIFO, one store call at a time.
//!
//! A denial says why, and the loop sleeps accordingly: until the end of a COOLDOWN (plus a
//! little jitter, so the fleet does not ask at one instant), or at the limit until a release
//! wakes it, with a slow poll as a safety net.

use std::time::{Duration, Instant};

use actix::{ActorFutureExt, AsyncContext, Context, WrapFuture};
use rand::Rng;
use wavegate_core::priority::{ClassView, next_class};
use wavegate_core::{Admission, Clock, DenyReason, WaveSignal, duration_ms};

use super::Coordinator;
use super::waiters::{Head, Waiters};
use crate::error::{Budget, Error};
use crate::messages::Grant;
use crate::metrics;
use crate::status::Mode;
#[cfg(feature = "redis")]
use wavegate_redis::ClassAsk;

/// How long to wait before asking again at the limit when no release is announced.
pub(super) const AT_LIMIT_POLL: (Duration, Duration) = (Duration::from_millis(250), Duration::from_millis(500));
/// How long to wait before asking again after a store error that is not an outage.
pub(super) const STORE_ERROR_RETRY: (Duration, Duration) = (Duration::from_millis(50), Duration::from_millis(150));
/// Spread added to a budget's exact wait, so processes do not ask at one instant.
const BUDGET_JITTER: (Duration, Duration) = (Duration::ZERO, Duration::from_millis(5));
/// The most jitter added to the end of a cooldown.
const COOLDOWN_JITTER: Duration = Duration::from_millis(50);

/// A duration drawn uniformly from `[low, high]`.
pub(super) fn jittered((low, high): (Duration, Duration)) -> Duration {
    low + (high - low).mul_f64(rand::rng().random::<f64>())
}

impl Coordinator {
    /// Serves the head of the queue: locally in a loop, or with one script call in flight.
    pub(super) fn pump(&mut self, upstream: usize, ctx: &mut Context<Self>) {
        loop {
            self.expire(upstream, Instant::now());
            if self.reconciling_of(upstream) {
                return;
            }
            let slot = &mut self.slots[upstream];
            if slot.pumping {
                slot.wake_pending = true;
                return;
            }
            if slot.blocked_until.is_some_and(|until| until > Instant::now()) {
                // The retry timer fires then; asking before would only be refused.
                return;
            }
            let now = Instant::now();
            let classes = !slot.config.classes().is_empty();
            let shared = self.shared_gate(upstream).is_some();
            let slot = &mut self.slots[upstream];
            // With classes the shared store chooses among the heads of every class; locally
            // the next class is chosen here, by the same rule.
            let heads = if classes { slot.waiters.heads(now) } else { Vec::new() };
            let head = match (classes, shared) {
                (false, _) => self.slots[upstream].waiters.head(now).map(|head| (head.id.clone(), head.tokens)),
                (true, true) => heads.first().map(|head| (head.id.clone(), head.tokens)),
                (true, false) => {
                    let (class, capped_wait) = self.next_local_class(upstream, &heads);
                    if let Some(wait) = capped_wait {
                        self.retry_in(upstream, Duration::from_millis(wait), ctx);
                    }
                    heads.iter().find(|head| Some(head.class) == class).map(|head| (head.id.clone(), head.tokens))
                }
            };
            let Some((id, tokens)) = head else { return };
            let slot = &mut self.slots[upstream];
            if let Some(timer) = slot.retry_timer.take() {
                ctx.cancel_future(timer);
            }
            let lease = slot.config.permit_ttl();
            #[cfg(feature = "redis")]
            if let Some(gate) = self.shared_gate(upstream) {
                let slot = &mut self.slots[upstream];
                if let Some((until, share)) = slot.rejoin_cap {
                    let now = Instant::now();
                    if now >= until {
                        slot.rejoin_cap = None;
                    } else if slot.held.len() >= share {
                        // Just back from a fallback: the shared set does not hold the permits
                        // of processes still in theirs yet, so stay within this process's share
                        // until they are back too. A release here, or the end of it, asks again.
                        self.retry_in(upstream, until - now, ctx);
                        return;
                    }
                }
                let epoch = self.epoch_of(upstream);
                let slot = &mut self.slots[upstream];
                slot.pumping = true;
                slot.wake_pending = false;
                // Every head asked for: (id, tokens); the grant names the one it is for.
                let asked: Vec<(String, u64)> = if classes {
                    heads.iter().map(|head| (head.id.clone(), head.tokens)).collect()
                } else {
                    vec![(id.clone(), tokens)]
                };
                let class_names: Vec<String> = if classes {
                    let names = slot.config.classes();
                    heads.iter().map(|head| names[head.class].name().to_owned()).collect()
                } else {
                    Vec::new()
                };
                let waiting: Vec<u32> =
                    heads.iter().map(|head| u32::try_from(head.waiting).unwrap_or(u32::MAX)).collect();
                let sent = asked.clone();
                let call = async move {
                    if class_names.is_empty() {
                        let (id, tokens) = &sent[0];
                        gate.acquire(id, lease, *tokens).await.map(|acquired| (acquired, Some(id.clone())))
                    } else {
                        let asks: Vec<ClassAsk<'_>> = sent
                            .iter()
                            .zip(&class_names)
                            .zip(&waiting)
                            .map(|(((id, tokens), class), waiting)| ClassAsk {
                                class,
                                id,
                                tokens: *tokens,
                                waiting: *waiting,
                            })
                            .collect();
                        gate.acquire_among(&asks, lease).await
                    }
                };
                ctx.spawn(call.into_actor(self).map(move |result, act, ctx| {
                    if epoch != act.epoch_of(upstream) {
                        // The mode changed meanwhile; the loop already went on without this
                        // reply. Unless it is a denial, the store may hold a registration of
                        // an asked id (a grant, or a script that ran after its reply was given
                        // up on, as a hung server does when it resumes): drop it once the
                        // store is back, unless the waiter holds the same id by then.
                        match result {
                            Ok((ref a, _)) if matches!(a.admission, Admission::Denied { .. }) => {}
                            Ok((_, Some(granted))) => {
                                let tokens = asked.iter().find(|(id, _)| *id == granted).map_or(0, |(_, t)| *t);
                                act.drop_registration(upstream, granted, tokens, ctx);
                            }
                            _ => {
                                // At most one of several heads asked for can have been
                                // charged, and which is unknown: refund none rather than all.
                                let several = asked.len() > 1;
                                for (id, tokens) in asked {
                                    act.drop_registration(upstream, id, if several { 0 } else { tokens }, ctx);
                                }
                            }
                        }
                        return;
                    }
                    act.slots[upstream].pumping = false;
                    match result {
                        Ok((acquired, granted)) => {
                            // A grant is for the head it names; a denial answers the first.
                            let (id, tokens) = granted
                                .and_then(|granted| asked.iter().find(|(id, _)| *id == granted).cloned())
                                .unwrap_or((id, tokens));
                            let serve_next = act.on_admission(upstream, id, tokens, acquired.admission, ctx);
                            if serve_next || act.slots[upstream].wake_pending {
                                act.pump(upstream, ctx);
                            }
                        }
                        Err(error) => {
                            // In an outage the script may have run although its reply was
                            // lost: drop the registration when the store is back, unless the
                            // waiter holds the same id by then (then it is adopted). Any other
                            // error is asked again with the same id, which is idempotent.
                            if error.is_outage() {
                                act.slots[upstream].outage.unreleased.extend(asked.into_iter().map(|(id, _)| id));
                            }
                            act.on_store_error(epoch, Some(upstream), "acquire", &error, ctx);
                        }
                    }
                }));
                return;
            }
            let now_ms = self.clock.now_ms();
            let admission = self.slots[upstream].local.acquire_with(&id, now_ms, duration_ms(lease), tokens);
            if !self.on_admission(upstream, id, tokens, admission, ctx) {
                return;
            }
        }
    }

    /// The class whose head this process's own gate (local mode, fallback) serves next: the
    /// same choice the shared store makes, over this process's permits and waiters.
    /// Also says, when no class can be served only because of their own budgets, in how many
    /// milliseconds the first of them can.
    fn next_local_class(&mut self, upstream: usize, heads: &[Head]) -> (Option<usize>, Option<u64>) {
        let now_ms = self.clock.now_ms();
        let slot = &mut self.slots[upstream];
        let classes = slot.config.classes();
        let limit = slot.local.machine().snapshot().limit;
        let mut views: Vec<ClassView> = classes
            .iter()
            .map(|class| ClassView {
                weight: class.weight_value().get(),
                reserved: class.reserved_at(limit),
                in_flight: 0,
                demand: 0,
                since_ms: 0,
                pass: 0,
            })
            .collect();
        for id in slot.held.keys() {
            let class = id.split_once('|').and_then(|(name, _)| slot.config.class_index(name));
            if let Some(view) = views.get_mut(class.unwrap_or(slot.config.default_class())) {
                view.in_flight += 1;
            }
        }
        // Ties go to the class whose head has waited longest, as in the store.
        let now = Instant::now();
        for head in heads {
            // With tenants a class has a head per tenant: its demand is their sum, its wait the
            // longest.
            let view = &mut views[head.class];
            let since_ms = now_ms.saturating_sub(duration_ms(now.saturating_duration_since(head.since)));
            view.since_ms = if view.demand == 0 { since_ms } else { view.since_ms.min(since_ms) };
            view.demand = view.demand.saturating_add(u32::try_from(head.waiting).unwrap_or(u32::MAX));
        }
        // A class whose own budget has nothing left takes no part; if that leaves none, ask
        // again when the first of them has.
        let mut capped_wait: Option<u64> = None;
        for head in heads {
            let view = &mut views[head.class];
            if view.demand > 0
                && let Some(wait) = slot.class_budgets.wait_ms(head.class, now_ms, head.tokens)
            {
                view.demand = 0;
                capped_wait = Some(capped_wait.map_or(wait, |w| w.min(wait)));
            }
        }
        slot.turns.observe(&mut views);
        let class = next_class(&views);
        (class, if class.is_none() { capped_wait } else { None })
    }

    /// Applies an acquire's answer; returns whether the next waiter may be served now.
    fn on_admission(
        &mut self,
        upstream: usize,
        id: String,
        tokens: u64,
        admission: Admission,
        ctx: &mut Context<Self>,
    ) -> bool {
        // A permit nobody takes gives its whole token reservation back.
        let refund = -i64::try_from(tokens).unwrap_or(i64::MAX);
        let now = Instant::now();
        match admission {
            Admission::Granted { wave, state, limit } => {
                let fallback = self.mode_of(upstream) == Mode::Fallback;
                // Granted by this process's own gate (local mode, fallback): the class budgets
                // here are charged; in shared mode the store charged the fleet's.
                let local_grant = self.mode_of(upstream) != Mode::Shared;
                let slot = &mut self.slots[upstream];
                slot.cooldown_until = None;
                slot.blocked_until = None;
                let Some(mut waiter) = slot.waiters.take(&id) else {
                    // The caller gave up while the script ran: give the permit back.
                    self.release(upstream, id, wave, WaveSignal::Neutral, refund, ctx);
                    return true;
                };
                // Answered before its deadline: its timer would only cost every later message.
                if let Some(timer) = waiter.deadline_timer.take() {
                    ctx.cancel_future(timer);
                }
                if local_grant && let Some(class) = slot.config.classes().get(waiter.class) {
                    // The weighted turns of this process's own choice (local mode, fallback),
                    // unless the grant is through the class's reserve (outside the turns).
                    let in_flight = slot
                        .held
                        .keys()
                        .filter(|held| held.split_once('|').map(|(name, _)| name) == Some(class.name()));
                    if in_flight.count() >= class.reserved_at(limit) as usize {
                        slot.turns.granted(waiter.class, class.weight_value().get());
                    }
                    slot.class_budgets.charge(waiter.class, self.clock.now_ms(), tokens);
                }
                slot.held.insert(id.clone(), wave);
                slot.waiters.granted(&waiter);
                if !fallback {
                    slot.last_shared.state = Some((state, limit));
                    slot.last_shared.wave = wave;
                }
                let now_ms = self.clock.now_ms();
                // The budgets in force: configured, or learned from the provider.
                if slot.local.budgets(now_ms) != wavegate_core::Budgets::default() {
                    let (memory, most) = super::RECENT_GRANTS;
                    let since = now_ms.saturating_sub(duration_ms(memory));
                    while slot.recent_grants.front().is_some_and(|(at, _)| *at < since)
                        || slot.recent_grants.len() >= most
                    {
                        slot.recent_grants.pop_front();
                    }
                    slot.recent_grants.push_back((now_ms, tokens));
                }
                if fallback {
                    slot.outage.granted += 1;
                    slot.outage.tokens += i64::try_from(tokens).unwrap_or(i64::MAX);
                }
                let at_head = waiter.at_head.unwrap_or(now);
                let queue_wait = at_head.saturating_duration_since(waiter.enqueued);
                let permit_wait = now.saturating_duration_since(at_head);
                let name = slot.config.name().as_str();
                metrics::permit_granted(name, queue_wait, permit_wait);
                if let Some(class) = slot.config.classes().get(waiter.class) {
                    metrics::class_granted(name, class.name(), queue_wait + permit_wait);
                }
                metrics::permits_in_flight(name, "local", slot.held.len());
                metrics::queue_depth(name, slot.waiters.len());
                metrics::wave(name, state, limit, wave);
                let grant = Grant { id, wave, state, limit, queue_wait, permit_wait };
                if let Err(Ok(grant)) = waiter.reply.send(Ok(grant)) {
                    slot.held.remove(&grant.id);
                    slot.waiters.released(&grant.id);
                    self.release(upstream, grant.id, wave, WaveSignal::Neutral, refund, ctx);
                }
                self.record_classes(upstream);
                true
            }
            Admission::Denied { reason: DenyReason::Cooldown, retry_after_ms } => {
                let rest = Duration::from_millis(retry_after_ms);
                let shared = self.mode_of(upstream) == Mode::Shared;
                let slot = &mut self.slots[upstream];
                slot.cooldown_until = Some(now + rest);
                if shared {
                    slot.last_shared.cooldown_until = Some(now + rest);
                }
                let jitter = COOLDOWN_JITTER.mul_f64(rand::rng().random::<f64>());
                self.block_until(upstream, rest + jitter, ctx);
                false
            }
            Admission::Denied { reason: DenyReason::AtLimit, .. } => {
                self.retry_in(upstream, jittered(AT_LIMIT_POLL), ctx);
                false
            }
            Admission::Denied { reason: DenyReason::TokensExceedBurst, .. } => {
                let class = self.slots[upstream].waiters.class_of(&id).unwrap_or(0);
                let error =
                    self.never_fits(upstream, tokens, class).unwrap_or_else(|| self.too_large(upstream, tokens, class));
                let slot = &mut self.slots[upstream];
                if let Some(timer) = slot.waiters.fail_head(&id, error) {
                    ctx.cancel_future(timer);
                }
                true
            }
            Admission::Denied { reason, retry_after_ms } => {
                // A rate budget says exactly when there is room: sleep until then.
                let wait = Duration::from_millis(retry_after_ms) + jittered(BUDGET_JITTER);
                let name = self.slots[upstream].config.name().as_str();
                tracing::trace!(upstream = name, reason = reason.as_str(), ?wait, "budget");
                metrics::budget_wait(name, reason.as_str());
                self.block_until(upstream, wait, ctx);
                false
            }
        }
    }

    /// Asks again in `after`, and not before: nothing can be admitted until then.
    fn block_until(&mut self, upstream: usize, after: Duration, ctx: &mut Context<Self>) {
        self.slots[upstream].blocked_until = Some(Instant::now() + after);
        self.retry_in(upstream, after, ctx);
    }

    pub(super) fn retry_in(&mut self, upstream: usize, after: Duration, ctx: &mut Context<Self>) {
        let slot = &mut self.slots[upstream];
        if let Some(timer) = slot.retry_timer.take() {
            ctx.cancel_future(timer);
        }
        slot.retry_timer = Some(ctx.run_later(after, move |act, ctx| {
            let slot = &mut act.slots[upstream];
            slot.retry_timer = None;
            slot.blocked_until = None;
            act.pump(upstream, ctx);
        }));
    }

    /// Answers the waiters whose deadline has passed.
    pub(super) fn expire(&mut self, upstream: usize, now: Instant) {
        let slot = &mut self.slots[upstream];
        let expired = slot.waiters.take_expired(now);
        if expired.is_empty() {
            return;
        }
        let retry_after = slot.cooldown_until.filter(|until| *until > now).map(|until| until - now);
        let name = slot.config.name().as_str();
        metrics::queue_depth(name, slot.waiters.len());
        for waiter in expired {
            if !waiter.reply.is_closed() {
                metrics::overload_refused(name, "waited_too_long");
            }
            Waiters::time_out(waiter, slot.config.name().as_str(), now, retry_after);
        }
    }
}

impl Coordinator {
    /// The tokens burst in force for `class`, and the budget it comes from: the upstream's
    /// (configured, in fallback this process's share of it, tightened by a tokens limit the
    /// provider announced: the local gate knows both in every mode, being told every
    /// announcement; in shared mode the store checks again with the fleet's), or a class
    /// with a budget share its share of the configured one, when that is smaller.
    fn tokens_burst(&self, upstream: usize, class: usize) -> Option<(u64, Budget)> {
        let slot = &self.slots[upstream];
        let label = match self.mode_of(upstream) {
            Mode::Fallback | Mode::Rejected => Budget::FallbackShare,
            Mode::Local | Mode::Shared => Budget::TokensPerMinute,
        };
        let burst = slot.local.tokens_burst(self.clock.now_ms())?;
        let capped = slot.config.classes().get(class).is_some_and(|c| c.budget_percent_value() < 100);
        let class_cap = slot.local.configured().tokens.map(|b| class_burst(slot, class, u64::from(b.burst())));
        match class_cap {
            Some(cap) if capped && cap < burst => Some((cap, Budget::ClassShare)),
            _ => Some((burst, label)),
        }
    }

    /// The refusal of an estimate that can never fit the tokens burst in force for `class`
    /// ([`tokens_burst`](Self::tokens_burst)).
    pub(super) fn never_fits(&self, upstream: usize, tokens: u64, class: usize) -> Option<Error> {
        let (burst, _) = self.tokens_burst(upstream, class)?;
        (tokens > burst).then(|| self.too_large(upstream, tokens, class))
    }

    fn too_large(&self, upstream: usize, tokens: u64, class: usize) -> Error {
        let slot = &self.slots[upstream];
        let (burst, budget) =
            self.tokens_burst(upstream, class).map_or((None, Budget::TokensPerMinute), |(b, l)| (Some(b), l));
        Error::insufficient_capacity(slot.config.name().as_str(), budget, tokens, burst.unwrap_or(0))
    }
}

/// The tokens burst of `class` given the upstream's `burst`: its share of it, with a budget
/// share ([`wavegate_core::class_budget::class_share`]).
fn class_burst(slot: &super::Slot, class: usize, burst: u64) -> u64 {
    match slot.config.classes().get(class).map(|c| c.budget_percent_value()) {
        Some(percent) if percent < 100 => {
            let share = |units: u64| (units * u64::from(percent) / 100).max(1);
            share(burst)
        }
        _ => burst,
    }
}
