//! What the handles ([`Scheduler`](crate::Scheduler), [`Upstream`](crate::Upstream),
//! [`Pool`](crate::Pool)) share: the configuration, the engine, the spent quotas.

use std::sync::Arc;

use std::sync::atomic::{AtomicBool, AtomicU64};

use wavegate_core::{PoolConfig, UpstreamConfig, UpstreamSet};

use crate::engine::Engine;
use crate::engine::store::Store;
use crate::error::Error;
use crate::history::HistoryRing;
use crate::pool_membership::PoolMembership;
use crate::quota::QuotaBlock;
use crate::registry::{self, Registration};
use crate::status::UpstreamStatus;

/// What the handles share.
#[derive(Debug)]
pub(crate) struct Inner {
    pub(crate) upstreams: Vec<UpstreamConfig>,
    /// The upstreams' names, shared with their permits.
    pub(crate) names: Vec<Arc<str>>,
    pub(crate) set: UpstreamSet,
    pub(crate) engine: Engine,
    /// Each upstream's spent quota, if any (see `quota.rs`).
    pub(crate) quota: Vec<Arc<QuotaBlock>>,
    /// Each upstream's history, written by its lane (see `history.rs`).
    pub(crate) history: Vec<Arc<HistoryRing>>,
    /// Each upstream's live weights in pools, written by its lane (see `pool_membership.rs`).
    pub(crate) membership: Vec<Arc<PoolMembership>>,
    /// The pools over the upstreams (see `pool.rs`).
    pub(crate) pools: Vec<PoolSlot>,
    /// Counted among the process's local schedulers (local mode only).
    pub(crate) registration: Option<Registration>,
    /// The shared store, if any (for its health).
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) store: Option<Store>,
}

impl Drop for Inner {
    /// The last handle is gone: before the actors' own thread stops, the releases already on
    /// their way to the shared store get there (at most `DRAIN_BOUND` more), so a process
    /// that exits right after its last call does not leave its permits to their leases.
    fn drop(&mut self) {
        if self.store.is_some() {
            self.engine.drain_blocking();
        }
    }
}

impl Inner {
    /// One upstream's status: the lane's, with the process's count of local schedulers.
    pub(crate) async fn status(&self, upstream: usize) -> Result<UpstreamStatus, Error> {
        let mut status = self.engine.status(upstream).await?;
        if self.registration.is_some() {
            status.schedulers_in_process = registry::live(&status.upstream);
        }
        Ok(status)
    }
}

/// A pool as the scheduler keeps it: its configuration, its members' indices, and how many
/// requests this process sent each member.
#[derive(Debug)]
pub(crate) struct PoolSlot {
    pub(crate) config: PoolConfig,
    /// The configured members (upstream indices), in order.
    pub(crate) members: Vec<usize>,
    /// Requests this process sent each upstream through the pool, by upstream index (a member
    /// put in live counts as a configured one does).
    pub(crate) picked: Vec<AtomicU64>,
    /// Whether every member is taken out live (warned once when it starts).
    pub(crate) all_out: AtomicBool,
}

impl PoolSlot {
    pub(crate) fn new(config: PoolConfig, members: Vec<usize>, upstreams: usize) -> Self {
        let picked = (0..upstreams).map(|_| AtomicU64::new(0)).collect();
        Self { config, members, picked, all_out: AtomicBool::new(false) }
    }
}
