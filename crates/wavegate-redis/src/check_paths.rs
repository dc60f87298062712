//! The startup check's run of every script path, on scratch keys.
//!
//! Redis checks a command inside a script against the user's rights only when it runs, and
//! some paths run only with priority classes, tenants, budgets, a provider's window, a waiter
//! to wake or a permit to adopt (and the live settings' change, read and clear). A run of the scripts on the upstreams' own keys would
//! change their state (a permit, a charge to a budget, a place on a waiting list), so
//! [`Store::check`](crate::Store::check) runs them here, on a scratch upstream of the same
//! namespace (`<prefix>:{_startup_check.<hash of the instance>}:…`): one with classes (one
//! capped), tenants, both rate budgets, limit 1; then the same keys without classes. Every
//! command any script runs is run once (`tests/acl.rs` removes each from the minimal user in
//! turn and checks that `build()` fails). The scratch keys expire a minute after the run.

use std::hash::{Hash, Hasher};
use std::time::Duration;

use wavegate_core::{
    Ask, Instance, LearnedLimit, LearnedLimits, LiveChange, LiveSetting, OutageUsage, PermitId, ServedSpan, TenantTag,
    TokenDelta, UpstreamConfig, WaveSignal, WindowLeft, WindowReport, duration_ms,
};

use crate::connection::Store;
use crate::error::StoreError;
use crate::shared_gate::SharedGate;

/// How long the scratch keys are kept after the run.
const SCRATCH_TTL: Duration = Duration::from_secs(60);

/// The scratch upstream's name for `instance`: one per process, so two processes that start
/// together do not meet on it.
fn scratch_name(instance: &str) -> String {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    instance.hash(&mut hasher);
    format!("_startup_check.{:016x}", hasher.finish())
}

/// The scratch upstream: limit 1, both budgets, two classes (the second capped).
fn scratch_config(name: &str, classes: bool) -> Result<UpstreamConfig, StoreError> {
    let builder = UpstreamConfig::builder(name)
        .limit(1)
        .requests_per_minute(6_000, 100)
        .tokens_per_minute(600_000, 10_000)
        .fallback_limit(1);
    let builder =
        if classes { builder.class("interactive", 3).class("batch", 1).class_budget("batch", 50) } else { builder };
    builder.build().map_err(|error| StoreError::invalid(format!("the startup check's scratch upstream: {error}")))
}

impl Store {
    /// Runs every script path on a scratch upstream for process `instance`: see the module
    /// docs. A right the user lacks fails here with [`StoreError::Rejected`].
    pub(crate) async fn check_paths(&self, instance: &str) -> Result<(), StoreError> {
        let name = scratch_name(instance);
        let me = Instance::new(instance).map_err(|error| StoreError::invalid(error.to_string()))?;
        let classed = SharedGate::for_upstream(self.clone(), &scratch_config(&name, true)?).for_instance(instance);
        let plain = SharedGate::for_upstream(self.clone(), &scratch_config(&name, false)?).for_instance(instance);
        let lease = Duration::from_secs(30);
        let tenant = |t: &str| Some(TenantTag::of(t));
        let id = |class: Option<&str>, n: u64, t: Option<&str>| PermitId::new(class, &me, n, t.and_then(tenant));
        let (first, second, lost, adopted) = (
            id(Some("interactive"), 1, Some("a")),
            id(Some("batch"), 2, None),
            id(Some("interactive"), 3, Some("b")),
            id(None, 4, None),
        );
        let waiter = id(None, 5, None);
        let every: Vec<String> =
            [&first, &second, &lost, &adopted, &waiter].iter().map(|id| id.as_str().to_owned()).collect();
        // A run before this one (the same instance id) left nothing held.
        classed.reconcile(&[], &every, lease, OutageUsage::NONE).await?;
        // Classes and tenants: a grant by the fleet-wide choice, two heads, one left waiting.
        let asks = [
            Ask { id: first.clone(), tokens: 10, output: 0, waiting: 2 },
            Ask { id: second.clone(), tokens: 10, output: 0, waiting: 1 },
        ];
        classed.acquire(&asks, lease).await?;
        // At the limit: the heads wait on the list.
        classed.acquire(&[Ask { id: lost.clone(), tokens: 10, output: 0, waiting: 1 }], lease).await?;
        // The provider's windows and announced limits (roomy: nothing is held back).
        let report = WindowReport {
            requests: Some(WindowLeft { remaining: 1_000, reset_ms: 1_000, refills_to: Some(2_000) }),
            tokens: Some(WindowLeft { remaining: 100_000, reset_ms: 1_000, refills_to: Some(200_000) }),
            input: Some(WindowLeft { remaining: 100_000, reset_ms: 1_000, refills_to: Some(200_000) }),
            output: Some(WindowLeft { remaining: 100_000, reset_ms: 1_000, refills_to: Some(200_000) }),
            limits: LearnedLimits {
                requests: Some(LearnedLimit { limit: 100_000, window_ms: 60_000 }),
                tokens: Some(LearnedLimit { limit: 10_000_000, window_ms: 60_000 }),
                ..LearnedLimits::default()
            },
            // A refusal's report: its reservation goes back to the windows first.
            refused: Some((10, 0)),
        };
        classed.report_window(first.as_str(), report, 10).await?;
        classed.status_with_classes().await?;
        // A renewal of a held id and of one the store lost (registered again).
        classed.renew(&[first.clone(), lost.clone()], lease).await?;
        // Releases with a settlement: the class's budget, the choice of whom to wake.
        // A success in shadow, with its span (the fleet's served calls: its own key).
        let now = crate::store_now_ms();
        let span = ServedSpan { went_ms: now - 2, ended_ms: now };
        let served = WaveSignal::ServedSuccess { at_most: 1, span: Some(span) };
        classed.finish(&first, 1, served, TokenDelta::new(-5, -5)).await?;
        classed.finish(&lost, 1, WaveSignal::Neutral, 0).await?;
        // An adoption after an outage, with its usage charged.
        classed.reconcile(&[adopted.as_str().to_owned()], &[], lease, OutageUsage::new(1, 10, Duration::ZERO)).await?;
        // Without classes: a waiter at the limit, woken by the release.
        plain.acquire(&[Ask { id: waiter.clone(), tokens: 10, output: 0, waiting: 1 }], lease).await?;
        plain.finish(&adopted, 1, WaveSignal::Neutral, 0).await?;
        classed.reconcile(&[], &every, lease, OutageUsage::NONE).await?;
        // The live settings: a change with an override's end, a read, a clear.
        let brief = LiveChange::set(LiveSetting::Limit, 1, Some(Duration::from_millis(1)))
            .map_err(|error| StoreError::invalid(error.to_string()))?;
        classed.change_live(&brief).await?;
        classed.live(None).await?;
        classed.change_live(&LiveChange::Clear(LiveSetting::Limit)).await?;
        self.expire_scratch(&classed).await
    }

    /// Lets the scratch upstream's keys go a minute from now.
    async fn expire_scratch(&self, gate: &SharedGate) -> Result<(), StoreError> {
        const COMMAND: &str = "PEXPIRE";
        let keys = gate.keys();
        let ttl = duration_ms(SCRATCH_TTL);
        for key in keys.finish_script_keys().into_iter().chain([keys.live.as_str()]) {
            let key = key.to_owned();
            let timeout = self.config().command_timeout;
            let _: i64 = self
                .bounded(COMMAND, timeout, |mut c| async move {
                    redis::cmd("PEXPIRE").arg(key).arg(ttl).query_async(&mut c).await
                })
                .await?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_scratch_upstream_is_a_valid_name_of_its_own_per_instance() {
        let (a, b) = (scratch_name("alpha"), scratch_name("beta"));
        assert_ne!(a, b);
        assert_eq!(a, scratch_name("alpha"));
        assert!(scratch_config(&a, true).is_ok(), "{a}");
        assert!(scratch_config(&scratch_name(&"x".repeat(128)), false).is_ok());
    }
}
