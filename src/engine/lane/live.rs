//! Live settings: an operator's changes to the upstream's limit while the fleet runs.
//!
//! In shared mode the lane looks at the store's live settings once a second (one small script
//! call, `lua/live.lua`, that answers the settings only when their version is not the one
//! applied) and at once when a change is announced on the release channel ([`CheckLive`]); in
//! local mode it reads the in-process gate's board. A new version is applied whole: the limit
//! in force becomes the live one (or the configured one again), sent to the scripts as their
//! base limit and given to the in-process gate, whose wave keeps what it learned below it
//! (`WaveMachine::rebase`). Permits held above a lowered limit run to their end; nobody is
//! admitted until the fleet is below it. In a fallback the last settings applied stay (and a
//! change is refused: it needs the store).

use std::num::NonZeroU32;

use actix::{ActorFutureExt, AsyncContext, Context, Handler, Message, WrapFuture};
use tokio::sync::oneshot;
use wavegate_core::{Clock, LiveChange, LiveSettings};

use super::actor::Lane;
use crate::engine::gate::Gate;
use crate::engine::store;
use crate::error::Error;
use crate::status::Mode;

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
                    return;
                }
                self.live_reading = true;
                let known = Some(self.live.version).filter(|_| self.live_read);
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
                    if let Some((version, reply)) = answer {
                        let _ = reply.send(Ok(version));
                    }
                }));
            }
            Gate::Local(local) if self.shared.is_none() => {
                let settings = local.live(self.clock.now_ms());
                if !self.live_read || settings.version != self.live.version {
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

    /// Applies `settings`: the limit in force becomes the live one, or the configured one.
    fn apply_live(&mut self, settings: LiveSettings, ctx: &mut Context<Self>) {
        let first = !self.live_read;
        self.live_read = true;
        let before = self.config.limit();
        let limit = settings.limit_or(self.configured_limit);
        let live_limit: Option<NonZeroU32> = settings.limit.map(|_| limit);
        if let Some(shared) = &self.shared {
            store::set_live_limit(shared, live_limit);
        }
        if limit != before {
            self.config = self.config.with_limit(limit);
            self.local.rebase(limit);
        }
        let changed = settings != self.live;
        self.live = settings;
        if first && settings.limit.is_none() {
            // Nothing live at start: the configured settings stand, nothing to say.
            return;
        }
        if changed || first {
            let remaining = settings.limit.and_then(|v| v.remaining);
            tracing::info!(
                upstream = %self.name(),
                version = settings.version,
                limit = limit.get(),
                configured = self.configured_limit.get(),
                before = before.get(),
                override_for = ?remaining,
                "live settings applied{}",
                if first && live_limit.is_some_and(|l| l != self.configured_limit) {
                    ": this process adopts the fleet's live limit over its configured one"
                } else {
                    ""
                }
            );
        }
        if limit > before {
            // Room for the callers waiting here.
            self.pump(ctx);
        }
    }
}
