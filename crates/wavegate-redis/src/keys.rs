//! Where an upstream's state lives in Redis.
//!
//! Every key of one upstream carries the upstream's name as a hash tag, `{name}`, so all of
//! them map to one Cluster slot and one script can touch them together. A namespace prefix
//! (default `wavegate`) keeps several deployments apart on one server.

use wavegate_core::UpstreamName;

/// The namespace prefix of every key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Keyspace {
    prefix: String,
}

impl Keyspace {
    /// The default prefix.
    pub const DEFAULT_PREFIX: &'static str = "wavegate";

    /// A keyspace under `prefix`. Braces are removed, since they would break the hash tag.
    pub fn new(prefix: impl Into<String>) -> Self {
        let prefix: String = prefix.into().chars().filter(|c| *c != '{' && *c != '}').collect();
        Self { prefix }
    }

    /// The keys of one upstream.
    pub fn upstream(&self, name: &UpstreamName) -> UpstreamKeys {
        let base = format!("{}:{{{}}}", self.prefix, name.as_str());
        UpstreamKeys {
            permits: format!("{base}:permits"),
            wave: format!("{base}:wave"),
            permit_waves: format!("{base}:permit_waves"),
            wakes: format!("{}:{{wake:", self.prefix),
            waiting: format!("{base}:waiting"),
            waiting_seen: format!("{base}:waiting_seen"),
            config: format!("{base}:config"),
            waiting_demand: format!("{base}:waiting_demand"),
            waiting_order: format!("{base}:waiting_order"),
            live: format!("{base}:live"),
            served: format!("{base}:served"),
            changes: format!("{}:{{live:changes}}:released", self.prefix),
        }
    }

    /// The sorted set of live instances (process heartbeats), shared by all upstreams.
    pub fn instances(&self) -> String {
        format!("{}:instances", self.prefix)
    }

    /// The prefix.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }
}

impl Default for Keyspace {
    fn default() -> Self {
        Self::new(Self::DEFAULT_PREFIX)
    }
}

/// The keys (and the wake-up channels) of one upstream.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct UpstreamKeys {
    /// Sorted set of held permits: member = permit id, score = lease end in ms (Redis time).
    pub permits: String,
    /// Hash of the wave state.
    pub wave: String,
    /// Hash of permit id → the wave it was issued in.
    pub permit_waves: String,
    /// The text before the instance id in the wake-up channels (`<prefix>:{wake:`): see
    /// [`wake_channel`](Self::wake_channel).
    pub wakes: String,
    /// Sorted set of the processes waiting at the limit: member = instance id, score = since
    /// when (ms). A release wakes the one that waited longest, not every process.
    pub waiting: String,
    /// Sorted set of the same processes: score = when each last asked (ms). A process that
    /// keeps asking keeps its place on `waiting`, however long it waits; one that stopped
    /// asking for 10 s is taken off both.
    pub waiting_seen: String,
    /// String: the configuration the last process to claim it uses (see
    /// [`SharedGate::claim_config`](crate::SharedGate::claim_config)), expiring a minute after.
    pub config: String,
    /// How many callers of each waiting process wait, by class (hash: `<class>|<instance>` →
    /// count; priority classes only).
    pub waiting_demand: String,
    /// Sorted set of the counted waiting members of each class and tenant, in the order they
    /// started waiting (every score 0, read by lexical range; priority classes only: see
    /// `lua/fleet.lua`). With the counts kept in `waiting_demand`, the choice of class reads
    /// a few fields per class instead of every waiting member.
    pub waiting_order: String,
    /// Hash of the live settings an operator set, with their epoch and version (see `lua/live.lua`).
    pub live: String,
    /// Sorted set of the calls at the provider lately in shadow mode in a fleet: member
    /// `<went ms>:<s|r>:<permit id>` (served or not), score the end (ms); kept a minute, at
    /// most 256 (see [`ServedSpans`](wavegate_core::ServedSpans), `lua/finish.lua`'s
    /// `record_went`).
    pub served: String,
    /// The fleet's pub/sub channel of live changes, `<prefix>:{live:changes}:released` (the same
    /// for every upstream): a change publishes the upstream's name there, and every process
    /// subscribes, so each looks at once.
    pub changes: String,
}

impl UpstreamKeys {
    /// The four keys every upstream script takes, in `KEYS` order.
    pub fn script_keys(&self) -> [&str; 4] {
        [&self.permits, &self.wave, &self.permit_waves, &self.waiting]
    }

    /// The keys of the scripts that keep the waiting list (acquire, finish and status): the
    /// four above, then `waiting_seen`, `waiting_demand` and `waiting_order`.
    pub fn waiting_script_keys(&self) -> [&str; 7] {
        [
            &self.permits,
            &self.wave,
            &self.permit_waves,
            &self.waiting,
            &self.waiting_seen,
            &self.waiting_demand,
            &self.waiting_order,
        ]
    }

    /// The keys of the finish script: [`waiting_script_keys`](Self::waiting_script_keys), then
    /// `served`.
    pub fn finish_script_keys(&self) -> [&str; 8] {
        let [a, b, c, d, e, f, g] = self.waiting_script_keys();
        [a, b, c, d, e, f, g, &self.served]
    }

    /// The pub/sub channel that wakes process `instance`: `<prefix>:{wake:<instance>}:released`.
    /// A release that frees a permit for a waiting process publishes the upstream's name on
    /// that process's channel only (one delivery per release, whatever the fleet's size); each
    /// process subscribes to its own channel, for all its upstreams. (Upstream names hold no
    /// `:`, so no upstream's keys share the tag `{wake:...}`; the ACL channel pattern
    /// `&<prefix>:{*}:released` covers every such channel.)
    pub fn wake_channel(&self, instance: &str) -> String {
        format!("{}{instance}}}:released", self.wakes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_key_shares_the_hash_tag() {
        let name = UpstreamName::new("openai").expect("valid");
        let keys = Keyspace::new("prod{x}").upstream(&name);
        assert_eq!(keys.permits, "prodx:{openai}:permits");
        for key in keys.finish_script_keys() {
            assert_eq!(key.matches("{openai}").count(), 1, "{key}");
            assert_eq!(key.matches('{').count(), 1, "{key}");
        }
    }
}
