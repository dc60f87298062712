//! Pool members changed live: an upstream's weight in a pool set, overridden or cleared while
//! the fleet runs ([`Pool::set_member`](crate::Pool::set_member), `wavegate set UPSTREAM
//! --pool POOL=WEIGHT`), stored with the upstream's other live settings
//! ([`LiveChange::pool_member`](wavegate_core::LiveChange::pool_member): `member|<pool>` in
//! its live hash, under its version).
//!
//! Each upstream's lane applies its live settings as they change (at once when a change is
//! announced, within 10 s otherwise) and writes the upstream's pool weights here; a pooled
//! request reads them when it starts: the members in force are the configured ones with their
//! live weights (0: out of the pool), then the other upstreams of this process that were put
//! in with a weight above 0, in the order they were configured. A request already walking the
//! members keeps the members it started with.

use std::collections::BTreeMap;
use std::sync::{PoisonError, RwLock};

use wavegate_core::LiveValue;

/// One upstream's live weights in pools, by pool name (empty: as configured).
#[derive(Debug, Default)]
pub(crate) struct PoolMembership {
    weights: RwLock<BTreeMap<String, u32>>,
}

impl PoolMembership {
    /// The lane applied live settings holding `pools` (the upstream's weights by pool name).
    pub(crate) fn apply(&self, pools: &BTreeMap<String, LiveValue>) {
        let weights =
            pools.iter().map(|(pool, value)| (pool.clone(), u32::try_from(value.value).unwrap_or(0))).collect();
        *self.weights.write().unwrap_or_else(PoisonError::into_inner) = weights;
    }

    /// The upstream's live weight in `pool`, if one is set.
    pub(crate) fn weight(&self, pool: &str) -> Option<u32> {
        self.weights.read().unwrap_or_else(PoisonError::into_inner).get(pool).copied()
    }
}
