//! Two applications, one upstream name: detecting a different configuration in the store.
//!
//! The scripts take the configuration with every call, so two processes that configure the
//! same upstream differently (two apps sharing a prefix, or a rolling deploy that changes a
//! limit) would each apply theirs to the shared state, call after call. Each process
//! therefore claims its configuration every few seconds: `SET …:config <its configuration>
//! GET PX 60000`. The value it replaces is the configuration of the last process that claimed;
//! a different one is a conflict, recorded in the store's health (and logged by the
//! scheduler) until a claim replaces its own configuration again. While a live value is in
//! force (`lua/live.lua`), claims that differ only in that setting are no conflict: every
//! process runs the live one.

use std::time::Duration;

use wavegate_core::UpstreamName;

use crate::calls::CONFIG_ARGS;
use crate::connection::Store;
use crate::error::StoreError;
use crate::shared_gate::SharedGate;

/// How long a claim stands: several claim periods.
pub const CONFIG_CLAIM_TTL: Duration = Duration::from_secs(60);

/// How many `|`-separated settings this version's claim holds (the scripts' configuration and
/// the fallback limit): a claim with another count is a process of another version's, which
/// [`SharedGate::from_claim`] does not read.
pub const CLAIM_SETTINGS: usize = CONFIG_ARGS + 1;

impl SharedGate {
    /// The configuration as the scripts receive it, `|`-separated — the limit, the wave's
    /// settings, the rate budgets and the priority classes (weights, reserves, budget shares,
    /// the default) — but for the classes' counting window (`@<ms>`, derived from the lease
    /// and the release's renewal cadence, which processes of the same configuration may
    /// differ in during a rolling deploy); then the fallback limit (`fallback:<n>`, or
    /// `fallback:-`), the one other setting the fleet's bounds depend on. Build the gate
    /// with [`SharedGate::for_upstream`] so that it holds all of them: two processes of one
    /// configuration then claim the same text.
    pub fn config_fingerprint(&self) -> String {
        let mut args = self.config_args.to_vec();
        if let Some(classes) = args.last_mut() {
            *classes = classes.split(',').filter(|entry| !entry.starts_with('@')).collect::<Vec<_>>().join(",");
        }
        args.push(format!("fallback:{}", self.fallback_limit.map_or("-".to_owned(), |limit| limit.to_string())));
        args.join("|")
    }

    /// The gate of upstream `name` as a process claimed it (`claim`: a
    /// [`config_fingerprint`](Self::config_fingerprint) read from the store), for an
    /// operator's tool that reads the fleet without its configuration. `None` when the text is
    /// not a claim.
    pub fn from_claim(store: Store, name: &UpstreamName, claim: &str) -> Option<Self> {
        let mut fields: Vec<&str> = claim.split('|').collect();
        let fallback = fields.pop()?.strip_prefix("fallback:")?;
        let config_args: [String; CONFIG_ARGS] =
            fields.iter().map(|field| (*field).to_owned()).collect::<Vec<_>>().try_into().ok()?;
        let mut gate = Self::new(store, name, &wavegate_core::WaveConfig::new(std::num::NonZeroU32::MIN));
        gate.config_args = config_args;
        gate.fallback_limit = fallback.parse().ok();
        Some(gate)
    }

    /// Claims this upstream's configuration; returns the different configuration another
    /// process had claimed, if any (also recorded in [`Store::health`](crate::Store::health);
    /// cleared by a claim that finds this one).
    pub async fn claim_config(&self) -> Result<Option<String>, StoreError> {
        const COMMAND: &str = "SET config";
        let (key, mine) = (self.keys.config.clone(), self.config_fingerprint());
        let ttl = wavegate_core::duration_ms(CONFIG_CLAIM_TTL);
        let value = mine.clone();
        let timeout = self.store.config().command_timeout;
        let previous: Option<String> = self
            .store
            .bounded(COMMAND, timeout, |mut c| async move {
                redis::cmd("SET").arg(key).arg(value).arg("GET").arg("PX").arg(ttl).query_async(&mut c).await
            })
            .await?;
        let other = previous.filter(|previous| !self.same_claim(previous, &mine));
        self.store.update_health(|h| match &other {
            Some(other) => {
                h.config_conflicts.insert(self.name.clone(), other.clone());
            }
            None => {
                h.config_conflicts.remove(&self.name);
            }
        });
        Ok(other)
    }

    /// Whether another process's claim `theirs` is `mine`: the same text, or the same but for
    /// the settings a live value is in force for ([`set_live`](Self::set_live)): the live one
    /// overrides them in every process alike (a process built with another limit adopts the
    /// fleet's and does not fight over it).
    fn same_claim(&self, theirs: &str, mine: &str) -> bool {
        let live = self.live_fields();
        let masked = |claim: &str| -> Vec<String> {
            claim
                .split('|')
                .enumerate()
                .map(|(at, field)| if live.contains(&at) { String::new() } else { field.to_owned() })
                .collect()
        };
        theirs == mine || (!live.is_empty() && masked(theirs) == masked(mine))
    }

    /// Publishes an empty message on this process's wake-up channel (it wakes nobody): the
    /// scripts publish with `pcall`, so missing channel rights would only show here.
    pub(crate) async fn check_publish(&self) -> Result<(), StoreError> {
        const COMMAND: &str = "PUBLISH";
        let channel = self.wake_channel();
        let timeout = self.store.config().command_timeout;
        let _receivers: i64 = self
            .store
            .bounded(COMMAND, timeout, |mut c| async move {
                redis::cmd("PUBLISH").arg(channel).arg("").query_async(&mut c).await
            })
            .await?;
        Ok(())
    }
}
