//! The permits held against one upstream, as the Redis sorted set keeps them.
//!
//! Each permit is an id chosen by the client with an expiry (its lease). Adding an id that is
//! already held does not add a second permit; removing is idempotent and says whether the id
//! was held; expired permits are purged before every count, exactly like
//! `ZREMRANGEBYSCORE key -inf now` followed by `ZCARD`.

use std::collections::HashMap;

/// One held permit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeldPermit {
    /// When the lease ends, in clock milliseconds; the permit is gone at or after this time.
    pub expires_ms: u64,
    /// The wave the permit was issued in.
    pub wave: u64,
    /// What the gate had granted right after this permit's grant, when it counted
    /// ([`ProviderWindows::charge`](crate::ProviderWindows::charge)): the mark its answer's
    /// report is measured from.
    pub sent: Option<crate::SentCount>,
}

/// The set of permits held against one upstream.
#[derive(Debug, Clone, Default)]
pub struct PermitLedger {
    held: HashMap<String, HeldPermit>,
}

impl PermitLedger {
    /// An empty ledger.
    pub fn new() -> Self {
        Self::default()
    }

    /// Removes the permits whose lease ended at or before `now_ms`; returns how many.
    pub fn purge_expired(&mut self, now_ms: u64) -> usize {
        let before = self.held.len();
        self.held.retain(|_, permit| permit.expires_ms > now_ms);
        before - self.held.len()
    }

    /// How many permits are held (including expired ones not purged yet).
    pub fn len(&self) -> usize {
        self.held.len()
    }

    /// Whether no permit is held.
    pub fn is_empty(&self) -> bool {
        self.held.is_empty()
    }

    /// The permit held under `id`, if any.
    pub fn get(&self, id: &str) -> Option<HeldPermit> {
        self.held.get(id).copied()
    }

    /// Adds (or, for an id already held, re-leases) a permit; returns whether it is new.
    pub fn insert(&mut self, id: &str, permit: HeldPermit) -> bool {
        match self.held.get_mut(id) {
            Some(existing) => {
                existing.expires_ms = existing.expires_ms.max(permit.expires_ms);
                false
            }
            None => {
                self.held.insert(id.to_owned(), permit);
                true
            }
        }
    }

    /// Removes a permit; returns it if it was held.
    pub fn remove(&mut self, id: &str) -> Option<HeldPermit> {
        self.held.remove(id)
    }

    /// Extends the lease of a held permit to `expires_ms`; returns whether it was held.
    pub fn renew(&mut self, id: &str, expires_ms: u64) -> bool {
        match self.held.get_mut(id) {
            Some(permit) => {
                permit.expires_ms = permit.expires_ms.max(expires_ms);
                true
            }
            None => false,
        }
    }

    /// Iterates over the held permits.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &HeldPermit)> {
        self.held.iter().map(|(id, permit)| (id.as_str(), permit))
    }
}
