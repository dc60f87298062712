//! Releases: a permit's outcome goes to the gate in charge; the lease watchdog renews the
//! permits still held; provider reports reach the gate.
//!
//! A call cancelled while its request was at the provider keeps its permit until the provider
//! has plausibly finished ([`Finish::hold_until`]); then it is released like any other.

use std::time::Duration;

use actix::{ActorFutureExt, AsyncContext, Context, WrapFuture};
use wavegate_core::{Clock, DenyReason, PermitId, RateLimitEffect, TokenDelta, WaveSignal, WindowReport};

use super::actor::Lane;
use crate::engine::clock::Instant;
use crate::engine::gate::{Answer, Settlement};
use crate::engine::grant::Finish;
use crate::engine::store::{Released, StoreError};
use crate::metrics;
use crate::status::Mode;

/// How long to wait before each new attempt at a release that failed for a reason other than
/// an outage (after the last, the permit's lease ends it).
const RELEASE_RETRIES: [Duration; 3] =
    [Duration::from_millis(100), Duration::from_millis(400), Duration::from_millis(1_600)];

/// A release to send (or send again).
#[derive(Debug)]
pub(super) struct Release {
    pub(super) id: PermitId,
    pub(super) wave: u64,
    pub(super) signal: WaveSignal,
    pub(super) token_delta: TokenDelta,
    /// Only a registration that may exist (no call ran under it here), or a record of a call
    /// in shadow (`fleet_record`): finding nothing to release is then no news.
    pub(super) registration_only: bool,
    /// A record of a call in shadow for the fleet's counts, or what it met judged by them
    /// (`FleetReport`): its id, a pass's, was never registered, so an outage leaves nothing to
    /// drop at the rejoin.
    pub(super) fleet_record: bool,
    /// What the call's answer said of the provider's windows, with the tokens it reserved: the
    /// store takes it in with the release (one round trip), with the first attempt only.
    pub(super) window: Option<(WindowReport, u64)>,
}

impl Lane {
    /// A permit's outcome: recorded by the breaker, then the permit goes back (or, for a call
    /// cancelled at the provider, stays held until it has plausibly finished there).
    pub(super) fn finish(&mut self, mut finish: Finish, ctx: &mut Context<Self>) {
        if let Some((ticket, result)) = finish.breaker.take() {
            let now = self.clock.now_ms();
            self.observe_breaker(|breaker| breaker.record(ticket, result, now));
        }
        let now = Instant::now();
        if let Some(until) = finish.hold_until.take().filter(|until| *until > now)
            && let Some(held) = self.held.get_mut(&finish.id)
        {
            tracing::debug!(upstream = %self.config.name(), permit = %finish.id, hold = ?(until - now), "call cancelled at the provider: its permit stays held");
            held.holding = Some(ctx.run_later(until - now, move |act, ctx| act.finish(finish, ctx)));
            return;
        }
        if self.reconciling {
            // Replayed once the reconciliation decides which gate is in charge.
            self.deferred.push(finish);
            return;
        }
        // The lane's own record of the wave wins: it follows the permit across modes.
        let held = self.held.remove(&finish.id);
        if let Some(timer) = held.as_ref().and_then(|held| held.holding) {
            ctx.cancel_future(timer);
        }
        let wave = held.map_or(finish.wave, |held| held.wave);
        self.waiters.released(&finish.id);
        self.gauges.local(self.config.name().as_str(), self.held.len());
        // Taken in before the release, so the grants its release makes room for already see
        // it: at once by the in-process gate, by the store in the release's own script.
        let window = finish.window.map(|report| (report, finish.tokens_reserved));
        if let Some((report, tokens)) = window {
            self.report_window(&finish.id, report, tokens);
        }
        self.record_classes();
        if finish.token_delta.total < 0 && self.heard.is_some_and(|(_, heard)| heard.reason == DenyReason::TokenBudget)
        {
            // Tokens come back: the tokens budget may have room before the wait it gave.
            self.blocked_until = None;
            self.heard = None;
        }
        if finish.token_delta.total != 0 && self.has_day_budget() {
            let (budgets, now_ms) = (self.config.budgets(), self.clock.now_ms());
            self.day_usage.settled(self.day_word(), finish.token_delta.total, budgets, now_ms);
        }
        let release = Release {
            id: finish.id,
            wave,
            signal: finish.signal,
            token_delta: finish.token_delta,
            registration_only: false,
            fleet_record: false,
            window,
        };
        self.release(release, 0, ctx);
        self.tell_spent_quota(ctx);
        // A release answered at once (no store call) may be the last a drain waited for.
        if !self.drains.is_empty() {
            self.answer_drains();
        }
    }

    /// One attempt at a release with the gate in charge.
    pub(super) fn release(&mut self, mut release: Release, attempt: u32, ctx: &mut Context<Self>) {
        // Sent once: a release sent again must not take the same answer in twice.
        let window = release.window.take();
        let settlement = Settlement { signal: release.signal, token_delta: release.token_delta, report: window };
        let now_ms = self.clock.now_ms();
        let answer = self.gate.release(&self.instance, release.id.clone(), release.wave, settlement, now_ms);
        match answer {
            Answer::Now(result) => self.on_released(result, release, attempt, None, ctx),
            Answer::Later(call) => {
                let epoch = self.epoch;
                let sent_after = self.acquires_sent;
                self.releases_in_flight += 1;
                ctx.spawn(call.into_actor(self).map(move |result, act, ctx| {
                    // Answered first (a retry it schedules is on its way too), then done.
                    act.on_released(result, release, attempt, Some((epoch, sent_after)), ctx);
                    act.release_done();
                }));
            }
        }
    }

    /// What a release's answer (or its failure) does: `store` is the epoch the store was asked
    /// under and the acquires sent before the release, `None` for the in-process gate's answer.
    fn on_released(
        &mut self,
        result: Result<Released, StoreError>,
        release: Release,
        attempt: u32,
        store: Option<(u64, u64)>,
        ctx: &mut Context<Self>,
    ) {
        let store_epoch = store.map(|(epoch, _)| epoch);
        match result {
            Ok(released) => {
                let after = released.after;
                let name = self.config.name().as_str();
                if store_epoch.is_some() {
                    // Every reply of the store says whether a shared cooldown runs, whoever
                    // started it (a late 429's too), and a reply that comes after a switch to
                    // fallback as well: the fallback must carry it on. The store settled this
                    // release itself: it is not the outage's usage.
                    if after.state == wavegate_core::WaveState::Cooldown {
                        self.last_shared.cooldown_until = Some(Instant::now() + after.cooldown_remaining);
                    }
                    self.last_shared.state = Some((after.state, after.limit));
                    self.last_shared.wave = after.wave;
                    if !released.held && !release.registration_only {
                        // Its lease ended while the call ran: for a while the fleet could admit
                        // one more than the limit.
                        tracing::warn!(upstream = %name, permit = %release.id, "permit released after its lease ended");
                        metrics::released_after_lease(name);
                    }
                } else if self.mode == Mode::Fallback {
                    // The outage's usage, charged to the store at the reconciliation.
                    self.outage.used(self.config.budgets(), self.clock.now_ms(), 0, release.token_delta.total);
                    if let (Some(RateLimitEffect::Cut { .. }), Some(retry_after)) =
                        (released.rate_limit, release.signal.rate_limited())
                    {
                        self.outage.rate_limited = Some(retry_after);
                    }
                    if self.outage.registered.remove(&release.id) {
                        self.outage.unreleased.insert(release.id);
                    }
                } else if !released.held && !release.registration_only {
                    metrics::released_after_lease(name);
                }
                // The gauges follow the gate in charge.
                if store_epoch.is_some() == self.gate.is_shared() {
                    if self.mode != Mode::Fallback {
                        self.gauges.fleet(name, after.in_flight as usize);
                        self.last_shared.in_flight = Some((after.in_flight, Instant::now()));
                        self.tally.fleet(after.in_flight);
                    }
                    self.gauges.wave(name, after.state, after.limit, after.wave);
                }
                record_rate_limit(name, released.rate_limit);
                if released.rate_limit.is_some() {
                    self.tally.rate_limited();
                }
                // The room it freed is asked for, unless an acquire sent after this release is
                // in flight: the store ran the release first, and that acquire saw the room.
                let seen = store.is_some_and(|(_, sent_before)| self.pumping && self.acquires_sent > sent_before);
                if !seen {
                    self.pump(ctx);
                }
            }
            Err(error) if !error.is_outage() => {
                metrics::redis_error("finish", error.label());
                if let Some(&delay) = RELEASE_RETRIES.get(attempt as usize) {
                    tracing::warn!(upstream = %self.name(), permit = %release.id, %error, attempt, "release failed; trying again");
                    // On its way to the store until the retry is sent: a drain waits for it.
                    self.releases_in_flight += 1;
                    ctx.run_later(delay, move |act, ctx| {
                        act.releases_in_flight -= 1;
                        if act.gate.is_shared() {
                            act.release(release, attempt + 1, ctx);
                        } else {
                            // The store went away meanwhile: the reconciliation drops it.
                            if !release.fleet_record {
                                act.outage.unreleased.insert(release.id);
                            }
                            act.answer_drains();
                        }
                    });
                } else {
                    tracing::error!(upstream = %self.name(), permit = %release.id, %error, "release failed; its lease will end it");
                }
            }
            Err(error) => {
                // The release may not have happened: drop the registration when the store is
                // back.
                if !release.fleet_record {
                    self.outage.unreleased.insert(release.id.clone());
                }
                self.on_store_error(store_epoch.unwrap_or(self.epoch), "finish", error, ctx);
                // (A 429 among the fleet's served calls, of shadow mode, is not carried: whether
                // enforcing would have met it takes the store's record.)
                if let WaveSignal::RateLimited { .. } = release.signal {
                    self.pending_429(release);
                }
            }
        }
    }

    /// One release fewer on its way to the store: drains waiting for none are answered.
    fn release_done(&mut self) {
        self.releases_in_flight = self.releases_in_flight.saturating_sub(1);
        self.answer_drains();
    }

    /// Answers the drains once nothing is on its way to the store: no release (or release
    /// retry), no acquire whose grant would need a release, no reconciliation, no ghost of a
    /// call in shadow still holding its permit.
    pub(super) fn answer_drains(&mut self) {
        if self.releases_in_flight == 0 && !self.pumping && !self.reconciling && self.shadow.holding() == 0 {
            for drain in self.drains.drain(..) {
                drain.send();
            }
        }
    }

    /// The store may hold a registration of `id` that nobody here holds (a grant whose reply
    /// came after a change of mode, a script that ran after its reply was given up on): in
    /// fallback it goes on the list of registrations the reconciliation drops; in shared mode it
    /// is released at once (giving back `tokens` reserved with it). A permit held here under the
    /// same id is left alone (the reconciliation adopts it; its release removes it).
    pub(super) fn drop_registration(&mut self, id: PermitId, (tokens, output): (u64, u64), ctx: &mut Context<Self>) {
        if self.gate.is_shared() && !self.reconciling {
            if !self.held.contains_key(&id) {
                let back = |n: u64| -i64::try_from(n).unwrap_or(i64::MAX);
                let token_delta = TokenDelta::new(back(tokens), back(output.min(tokens)));
                let release = Release {
                    id,
                    wave: 0,
                    signal: WaveSignal::Neutral,
                    token_delta,
                    registration_only: true,
                    fleet_record: false,
                    window: None,
                };
                self.release(release, 0, ctx);
            }
        } else {
            self.outage.unreleased.insert(id);
        }
    }

    /// Hands what a response said is left of the provider's windows to the in-process gate,
    /// whichever gate is in charge, so a fallback starts knowing it (the store takes it in
    /// with the call's release).
    fn report_window(&mut self, id: &PermitId, report: WindowReport, tokens: u64) {
        metrics::provider_window_report(self.name());
        self.local.report_window(id, report, self.clock.now_ms(), tokens);
    }

    /// The lease watchdog: renews every permit this process holds.
    pub(super) fn renew(&mut self, ctx: &mut Context<Self>) {
        if self.held.is_empty() {
            return;
        }
        let ids: Vec<PermitId> = self.held.keys().cloned().collect();
        let epoch = self.epoch;
        let answer = self.gate.renew(ids.clone(), self.config.permit_ttl(), self.clock.now_ms());
        let call = match answer {
            // The in-process gate registers again whatever it had lost, silently.
            Answer::Now(_) => return,
            Answer::Later(call) => call,
        };
        ctx.spawn(call.into_actor(self).map(move |result, act, ctx| match result {
            Ok(again) => {
                // Registered again because the store no longer listed them: either it lost them
                // while their calls run, or their release reached it first (a NOSCRIPT reload
                // resends the renewal behind it). The latter must not hold a slot for a lease.
                let (running, ended): (Vec<PermitId>, Vec<PermitId>) =
                    again.into_iter().partition(|id| act.held.contains_key(id));
                if !running.is_empty() {
                    tracing::warn!(
                        upstream = %act.name(),
                        again = running.len(),
                        "the store had lost permits whose calls still run; registered them again"
                    );
                }
                for id in ended {
                    act.drop_registration(id, (0, 0), ctx);
                }
            }
            Err(error) => {
                // The renewal may still run (a hung server resumes): any permit of it that has
                // ended by then would be registered again.
                let outage = error.is_outage();
                act.on_store_error(epoch, "renew", error, ctx);
                if outage {
                    let ended: Vec<PermitId> = ids.into_iter().filter(|id| !act.held.contains_key(id)).collect();
                    for id in ended {
                        act.drop_registration(id, (0, 0), ctx);
                    }
                }
            }
        }));
    }
}

/// Counts a reported 429 and what it did to the wave.
fn record_rate_limit(upstream: &str, effect: Option<RateLimitEffect>) {
    match effect {
        Some(RateLimitEffect::Cut { .. }) => metrics::rate_limited(upstream, Some(true)),
        Some(RateLimitEffect::Late { .. }) => metrics::rate_limited(upstream, Some(false)),
        None => {}
    }
}
