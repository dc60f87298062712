//! Claiming each upstream's configuration in the store, to detect another application (or
//! another version of this one) that shares the upstream's keys with a different
//! configuration: see `wavegate_redis::SharedGate::claim_config`. A conflict is logged as an
//! error at every claim while it lasts and shown by `Scheduler::store_health`.

use std::time::Duration;

use actix::{ActorFutureExt, AsyncContext, Context, WrapFuture};

use super::Coordinator;
use crate::status::Mode;

/// How often each upstream's configuration is claimed (the claim stands for a minute).
pub(super) const CONFIG_CLAIM_EVERY: Duration = Duration::from_secs(10);

impl Coordinator {
    /// Claims the configuration of every upstream in shared mode (one command per upstream).
    pub(super) fn claim_configs(&mut self, ctx: &mut Context<Self>) {
        for upstream in 0..self.slots.len() {
            if self.mode_of(upstream) != Mode::Shared {
                continue;
            }
            let Some(gate) = self.slots[upstream].shared.clone() else { continue };
            let call = async move {
                let theirs = gate.claim_config().await;
                (gate, theirs)
            };
            ctx.spawn(call.into_actor(self).map(|(gate, theirs), _, _| match theirs {
                Ok(Some(theirs)) => tracing::error!(
                    upstream = %gate.keys().config,
                    ours = %gate.config_fingerprint(),
                    %theirs,
                    "another process shares this upstream's keys with another configuration; \
                     give each application its own key prefix"
                ),
                Ok(None) => {}
                Err(error) => tracing::debug!(%error, "could not claim an upstream's configuration"),
            }));
        }
    }
}
