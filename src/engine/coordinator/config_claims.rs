//! Claiming each upstream's configuration in the store, to detect another application (or
//! another version of this one) that shares the upstream's keys with a different
//! configuration: see `wavegate_redis::SharedGate::claim_config`. A conflict is logged as an
//! error at every claim while it lasts and shown by `Scheduler::store_health`.

use actix::{ActorFutureExt, AsyncContext, Context, WrapFuture};

use super::actor::Coordinator;
use crate::engine::store;
use crate::status::Mode;

impl Coordinator {
    /// Claims the configuration of every upstream in shared mode (one command per upstream).
    pub(super) fn claim_configs(&mut self, ctx: &mut Context<Self>) {
        for upstream in 0..self.gates.len() {
            if self.domains[self.domain_of[upstream]].mode != Mode::Shared {
                continue;
            }
            let Some(gate) = &self.gates[upstream] else { continue };
            ctx.spawn(store::claim_config(gate).into_actor(self).map(|result, _, _| match result {
                Ok(Some(conflict)) => tracing::error!(
                    upstream = %conflict.upstream,
                    ours = %conflict.ours,
                    theirs = %conflict.theirs,
                    "another process shares this upstream's keys with another configuration; \
                     give each application its own key prefix"
                ),
                Ok(None) => {}
                Err(error) => tracing::debug!(%error, "could not claim an upstream's configuration"),
            }));
        }
    }
}
