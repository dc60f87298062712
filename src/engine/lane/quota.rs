//! Spent quotas, fleet-wide: a spent quota this process met is told to the fleet through the
//! live settings (`quota_spent`, with what is left of the pause as its time to live), and one
//! told by another process refuses the upstream here too — so a spent quota costs the fleet
//! about one attempt, not one per process. An operator's fleet-wide reset drops it
//! (`wavegate reset-quota`). In local mode and in fallback nothing is told: the refusal is
//! this process's (`quota.rs`).

use std::time::Duration;

use actix::{ActorFutureExt, AsyncContext, Context, WrapFuture};
use wavegate_core::LiveSettings;

use super::actor::Lane;
use crate::engine::clock::{self, Instant};
use crate::engine::store;
use crate::status::Mode;

/// A refusal already told that ends within this of a new one is not told again.
const TOLD_SLACK: Duration = Duration::from_secs(1);

impl Lane {
    /// After a finish: a spent quota this process met and the fleet was not told of yet is
    /// told (once per refusal).
    pub(super) fn tell_spent_quota(&mut self, ctx: &mut Context<Self>) {
        let Some(left) = self.quota.remaining() else { return };
        let Some(shared) = self.shared.clone().filter(|_| self.mode == Mode::Shared) else { return };
        let until = clock::after(Instant::now(), left);
        if self.quota_told.is_some_and(|told| clock::after(told, TOLD_SLACK) >= until) {
            return;
        }
        self.quota_told = Some(until);
        ctx.spawn(store::spend_quota(&shared, left).into_actor(self).map(move |result, act, _| match result {
            Ok(version) => {
                tracing::info!(upstream = %act.name(), version, pause = ?left, "spent quota told to the fleet");
            }
            Err(error) => {
                // The other processes meet it with their own first attempt, as before.
                tracing::warn!(upstream = %act.name(), %error, "could not tell the fleet of a spent quota");
                act.quota_told = None;
            }
        }));
    }

    /// The fleet's spent quota, from the live settings being applied: refused here too for
    /// what is left of it — once: a spent quota already told or applied here (it stays in
    /// every later version of the settings) is not applied again, so a refusal this process
    /// lifted on its own (`Upstream::reset_quota`) is not put back by an unrelated change.
    pub(super) fn apply_spent_quota(&mut self, settings: &LiveSettings) {
        let Some(left) = settings.quota_spent.and_then(|spent| spent.remaining).filter(|left| !left.is_zero()) else {
            return;
        };
        let until = clock::after(Instant::now(), left);
        if self.quota_told.is_some_and(|told| clock::after(told, TOLD_SLACK) >= until) {
            return;
        }
        self.quota_told = Some(self.quota_told.map_or(until, |told| told.max(until)));
        let refused_before = self.quota.remaining().is_some();
        let refused_for = self.quota.exhaust(left);
        if !refused_before {
            tracing::warn!(
                upstream = %self.name(),
                ?refused_for,
                version = settings.version,
                "another process met a spent quota: calls are refused until then or an operator reset"
            );
            crate::metrics::quota_exhausted(self.name(), true);
        }
    }
}
