//! An operator's clear of the provider's windows: a window a broken answer set (a `Retry-After`
//! of a day) is forgotten for the fleet, and every process's next look at it admits again.

use actix::{ActorFutureExt, AsyncContext, Context, Handler, WrapFuture};

use super::actor::Lane;
use super::messages::ClearWindows;
use crate::engine::gate::Gate;
use crate::engine::store;
use crate::error::Error;

impl Handler<ClearWindows> for Lane {
    type Result = ();

    fn handle(&mut self, clear: ClearWindows, ctx: &mut Context<Self>) {
        // The in-process gate at once: it is the fallback's start, and local mode's gate.
        self.local.clear_windows();
        let Gate::Shared(gate) = &self.gate else {
            self.windows_cleared("this process", ctx);
            let _ = clear.reply.send(Ok(()));
            return;
        };
        let call = store::clear_windows(gate);
        ctx.spawn(call.into_actor(self).map(move |result, act, ctx| match result {
            Ok(()) => {
                act.windows_cleared("the fleet", ctx);
                let _ = clear.reply.send(Ok(()));
            }
            Err(error) => {
                tracing::warn!(upstream = %act.name(), %error, "clearing the provider's window failed");
                let _ = clear.reply.send(Err(Error::store_unavailable(
                    act.name(),
                    "clearing the provider's window",
                    error.to_string(),
                )));
            }
        }));
    }
}

impl Lane {
    fn windows_cleared(&mut self, scope: &'static str, ctx: &mut Context<Self>) {
        tracing::warn!(upstream = %self.name(), scope, "provider window cleared by an operator");
        self.window_until = None;
        self.blocked_until = None;
        self.heard = None;
        self.pump(ctx);
    }
}
