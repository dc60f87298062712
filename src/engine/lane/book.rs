//! What a lane keeps of an outage, for its reconciliation.

use std::collections::HashSet;
use std::time::Duration;

use wavegate_core::{Budgets, ChargeStart, PermitId};

/// Book-keeping of one upstream during a fallback, for the reconciliation.
#[derive(Debug, Default)]
pub(super) struct OutageBook {
    /// Permits held when the outage began: they are registered in the shared store.
    pub(super) registered: HashSet<PermitId>,
    /// Registrations to drop when the store is back: permits of `registered` that finished
    /// during the outage, releases that failed, grants whose reply came too late. (Any of them
    /// still held by then is adopted instead.)
    pub(super) unreleased: HashSet<PermitId>,
    /// The fallback gate's wave when the outage began: the local number of the shared wave
    /// then in force.
    pub(super) entry_wave: u64,
    /// A 429 cut the local wave during the outage, with the cooldown it asked for.
    pub(super) rate_limited: Option<Option<Duration>>,
    /// 429s whose report to the store failed before the switch: (their wave, Retry-After).
    pub(super) unreported_429s: Vec<(u64, Option<Duration>)>,
    /// Permits granted locally during the outage (usage to hand to the shared budgets).
    pub(super) granted: u64,
    /// Tokens used during the outage: reservations plus settlements.
    pub(super) tokens: i64,
    /// The latest start the outage's usage can be charged to the day budgets from (the lane
    /// clock's ms).
    pub(super) charge_start: ChargeStart,
    /// The outage's usage's identity: the store charges it once, however often a
    /// reconciliation whose reply was lost sends it again.
    pub(super) usage_id: u64,
}

impl OutageBook {
    /// `requests` granted and `tokens` used (a settlement's are negative when it gives some back)
    /// at `now_ms` during the outage, placed in time for the day budgets ([`ChargeStart`]: a
    /// refund leaves the start where it was).
    pub(super) fn used(&mut self, budgets: Budgets, now_ms: u64, requests: u64, tokens: i64) {
        let before = (self.granted, u64::try_from(self.tokens).unwrap_or(0));
        let more = (requests, u64::try_from(tokens).unwrap_or(0));
        self.charge_start.used(budgets, now_ms, before, more);
        self.granted = self.granted.saturating_add(requests);
        self.tokens = self.tokens.saturating_add(tokens);
    }
}

/// A usage id no other outage, of this process or another, is likely to share: 64 bits of the
/// standard hasher's random keys over a counter and the time (never 0: no id).
pub(super) fn usage_id() -> u64 {
    use std::hash::{BuildHasher, Hash, Hasher};
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNT: AtomicU64 = AtomicU64::new(0);
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    COUNT.fetch_add(1, Ordering::Relaxed).hash(&mut hasher);
    std::time::SystemTime::now().hash(&mut hasher);
    hasher.finish().max(1)
}
