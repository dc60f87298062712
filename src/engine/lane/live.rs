//! Live settings: an operator's changes to the upstream's limit and budget rates while the
//! fleet runs.
//!
//! In shared mode the lane looks at the store's live settings at once when a change is
//! announced on the fleet's channel of live changes ([`CheckLive`]; every process subscribes,
//! and looks again each time its subscription is made, so a change announced while it was down
//! is not missed), and otherwise every [`LIVE_SAFETY_NET_HEARD`] while it hears them (every
//! [`LIVE_SAFETY_NET`] while it does not: no subscription) (one small script call,
//! `lua/live.lua`, that answers the settings only when their epoch and version are not the ones applied):
//! a safety net whose cost per process and upstream stays small, not a look every second. In
//! local mode it reads the in-process gate's board every second. A new version is applied whole: the limit
//! in force becomes the live one (or the configured one again), sent to the scripts as their
//! base limit and given to the in-process gate, whose wave keeps what it learned below it
//! (`WaveMachine::rebase`); a live rate is sent as its budget's, and each budget keeps the
//! units it holds (`rebudget` in `wave.lua`, `LocalGate::set_budgets`). Permits held above a lowered limit run to their end; nobody is
//! admitted until the fleet is below it. In a fallback the last settings applied stay (and a
//! change is refused: it needs the store); back in shared mode the lane looks at once. An
//! override's lane looks again right at its end, so the revert reaches every process within a
//! few milliseconds of it. Settings of another epoch (the store lost them: `FLUSHALL`, an empty
//! restart) are applied whole whatever their version — none set: the configured values again.

use actix::{ActorFutureExt, AsyncContext, Context, Handler, Message, WrapFuture};
use tokio::sync::oneshot;
use wavegate_core::{Clock, LiveChange, LiveSettings};

use super::actor::Lane;
use crate::engine::gate::Gate;
use crate::engine::store;
use crate::error::Error;
use crate::status::Mode;

/// How long after an override's end (as the store said it) its lane looks again: the store's
/// clock and this process's may disagree by a little.
const OVERRIDE_END_SLACK: std::time::Duration = std::time::Duration::from_millis(20);

/// How often a lane in shared mode looks at the store's live settings when no change is
/// announced and the process does not hear the announcements (no subscription: a user without
/// channel rights, a connection being made again): a change reaches every process within
/// milliseconds when announced, within this when not.
pub(crate) const LIVE_SAFETY_NET: std::time::Duration = std::time::Duration::from_secs(10);

/// The same while the process hears the announcements (its subscription is made, and each
/// new subscription looks at once): only a change whose announcement was lost on a live
/// connection, or made by a user without the right to publish, waits for it. At 200
/// schedulers × 100 upstreams the 10 s look was 2,000 script calls a second, about two per
/// permit in the scale scenario (`docs/redis.md`).
pub(crate) const LIVE_SAFETY_NET_HEARD: std::time::Duration = std::time::Duration::from_secs(60);

/// Look at the live settings now (a change was announced).
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub(crate) struct CheckLive;

/// Store a live change (for the fleet in shared mode, for the process in local mode), apply
/// it here, and answer its version.
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub(crate) struct ChangeLive {
    pub(crate) change: LiveChange,
    pub(crate) reply: oneshot::Sender<Result<u64, Error>>,
}

impl Handler<CheckLive> for Lane {
    type Result = ();

    fn handle(&mut self, _: CheckLive, ctx: &mut Context<Self>) {
        self.check_live(ctx, None);
    }
}

impl Handler<ChangeLive> for Lane {
    type Result = ();

    fn handle(&mut self, change: ChangeLive, ctx: &mut Context<Self>) {
        let ChangeLive { change, reply } = change;
        match (&self.gate, &self.shared) {
            _ if change.check_for(&self.configured).is_err() => {
                let error = change.check_for(&self.configured).err().map(|e| Error::invalid_setting(self.name(), e));
                let _ = reply.send(Err(error.unwrap_or_else(Error::stopped)));
            }
            (Gate::Shared(gate), _) => {
                let call = store::change_live(gate, change);
                ctx.spawn(call.into_actor(self).map(move |result, act, ctx| match result {
                    Ok(version) => act.check_live(ctx, Some((version, reply))),
                    Err(error) => {
                        tracing::warn!(upstream = %act.name(), %error, "a live change could not be stored");
                        let _ =
                            reply.send(Err(Error::store_unavailable(act.name(), "a live change", error.to_string())));
                    }
                }));
            }
            (Gate::Local(_), Some(_)) => {
                let message = "the upstream is in fallback; a live change needs the shared store".to_owned();
                let _ = reply.send(Err(Error::store_unavailable(self.name(), "a live change", message)));
            }
            (Gate::Local(local), None) => {
                let version = local.change_live(&change, self.clock.now_ms());
                self.check_live(ctx, None);
                let _ = reply.send(Ok(version));
            }
        }
    }
}

impl Lane {
    /// The lane's timer: the in-process board at each tick, the store's once every
    /// [`LIVE_SAFETY_NET`] (announced changes are looked at when announced).
    pub(super) fn look_at_live(&mut self, ctx: &mut Context<Self>) {
        let shared = matches!(self.gate, Gate::Shared(_)) && self.mode == Mode::Shared;
        let now = crate::engine::clock::Instant::now();
        let net = if self.hears_changes.load(std::sync::atomic::Ordering::Relaxed) {
            LIVE_SAFETY_NET_HEARD
        } else {
            LIVE_SAFETY_NET
        };
        if shared && self.live_looked.is_some_and(|at| now.duration_since(at) < net) {
            return;
        }
        self.check_live(ctx, None);
    }

    /// Looks at the live settings and applies a new version; `answer` (a change's version and
    /// its caller) is answered once the settings read are applied.
    pub(super) fn check_live(
        &mut self,
        ctx: &mut Context<Self>,
        answer: Option<(u64, oneshot::Sender<Result<u64, Error>>)>,
    ) {
        match &self.gate {
            Gate::Shared(gate) if self.mode == Mode::Shared => {
                if self.live_reading && answer.is_none() {
                    // A change announced while a look is in flight may have been made after
                    // that look read the store: one more look once it is back.
                    self.live_again = true;
                    return;
                }
                self.live_reading = true;
                self.live_again = false;
                self.live_looked = Some(crate::engine::clock::Instant::now());
                let known = Some(self.live.stamp()).filter(|_| self.live_read);
                let call = store::live(gate, known);
                ctx.spawn(call.into_actor(self).map(move |result, act, ctx| {
                    act.live_reading = false;
                    match result {
                        Ok(Some(settings)) => act.apply_live(settings, ctx),
                        Ok(None) => {}
                        Err(error) => {
                            crate::metrics::redis_error("live", error.label());
                            tracing::debug!(upstream = %act.name(), %error, "could not read the live settings");
                        }
                    }
                    if std::mem::take(&mut act.live_again) {
                        act.check_live(ctx, None);
                    }
                    if let Some((version, reply)) = answer {
                        let _ = reply.send(Ok(version));
                    }
                }));
            }
            Gate::Local(local) if self.shared.is_none() => {
                let settings = local.live(self.clock.now_ms());
                if !self.live_read || settings.stamp() != self.live.stamp() {
                    self.apply_live(settings, ctx);
                }
                if let Some((version, reply)) = answer {
                    let _ = reply.send(Ok(version));
                }
            }
            // A fallback keeps the settings last applied.
            _ => {
                if let Some((version, reply)) = answer {
                    let _ = reply.send(Ok(version));
                }
            }
        }
    }

    /// Applies `settings`: the limit, the budgets' rates and the classes' weights and reserves
    /// in force become the live ones, or the configured ones.
    fn apply_live(&mut self, settings: LiveSettings, ctx: &mut Context<Self>) {
        let first = !self.live_read;
        self.live_read = true;
        if !first && self.live.epoch != 0 && settings.epoch != self.live.epoch {
            // The settings started over: the store lost them (the epoch is written once, with
            // the first version). What the fleet set before is gone; what is set now applies,
            // the configured values elsewhere. Once per loss: the new epoch is applied here.
            tracing::warn!(
                upstream = %self.name(),
                applied_version = self.live.version,
                version = settings.version,
                "the store lost the live settings (FLUSHALL, an eviction or an empty restart): \
                 applying the fleet's settings anew, the configured values where none is set"
            );
        }
        let before = self.config.limit();
        let config = settings.apply_to(&self.configured);
        if let Some(shared) = &self.shared {
            store::set_live(shared, &settings);
        }
        if config != self.config {
            self.local.apply_live(&config, self.clock.now_ms());
            self.config = config;
            // What the gate said under the old settings (a budget's wait at the old rate, the
            // limit reached) proves nothing now: the waiters ask again at once, and no caller
            // is refused early from it.
            self.blocked_until = None;
            self.heard = None;
            // A class switched to shadow holds none of its callers back, those waiting included.
            self.let_waiting_through(ctx);
        }
        let changed = settings != self.live;
        self.membership.apply(&settings.pools);
        self.apply_spent_quota(&settings);
        if !first && settings.quota_reset.is_some() && settings.quota_reset != self.live.quota_reset {
            self.quota_told = None;
            if self.quota.reset() {
                tracing::info!(upstream = %self.name(), version = settings.version, "quota refusal lifted by an operator, fleet-wide");
                crate::metrics::quota_exhausted(self.name(), false);
            }
        }
        self.live = settings;
        crate::metrics::live_version(self.name(), self.live.version);
        // An override ends at a known time: look again right then (the first look after its
        // end reverts it for everyone), not at the next second.
        if let Some(timer) = self.live_timer.take() {
            ctx.cancel_future(timer);
        }
        if let Some(left) = self.live.next_end() {
            let after = left + OVERRIDE_END_SLACK;
            self.live_timer = Some(ctx.run_later(after, |act, ctx| {
                act.live_timer = None;
                act.check_live(ctx, None);
            }));
        }
        if first && self.live.is_empty() {
            // Nothing live at start: the configured settings stand, nothing to say.
            return;
        }
        if changed || first {
            let limit = self.config.limit();
            let rate = |b: Option<wavegate_core::RateBudget>| b.map(|b| b.per_minute());
            let classes: Vec<String> = self
                .config
                .classes()
                .iter()
                .map(|c| format!("{}:{}:{}%", c.name(), c.weight_value(), c.reserve_percent_value()))
                .collect();
            tracing::info!(
                upstream = %self.name(),
                version = self.live.version,
                limit = limit.get(),
                configured = self.configured.limit().get(),
                requests_per_minute = ?rate(self.config.budgets().requests),
                tokens_per_minute = ?rate(self.config.budgets().tokens),
                requests_burst = ?self.config.budgets().requests.map(|b| b.burst()),
                tokens_burst = ?self.config.budgets().tokens.map(|b| b.burst()),
                classes = %classes.join(","),
                pools = %self.live.pools.iter().map(|(pool, w)| format!("{pool}:{}", w.value)).collect::<Vec<_>>().join(","),
                override_for = ?self.live.next_end(),
                "live settings applied{}",
                if first && self.config != self.configured {
                    ": this process adopts the fleet's live settings over its configured ones"
                } else {
                    ""
                }
            );
        }
        // Room for the callers waiting here (a raised limit or rate).
        if self.config.limit() > before || changed {
            self.pump(ctx);
        }
    }
}
