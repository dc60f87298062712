//! What a process used while another gate was in charge (its fallback through a store outage),
//! charged back to the shared budgets at the reconciliation ([`LocalGate::charge`](crate::LocalGate::charge);
//! `lua/reconcile.lua` is the twin).

use std::time::Duration;

/// Requests and tokens used during an outage, and how long ago it began: the per-minute
/// budgets take them up to empty at most, the day budgets as used from the outage's start (a
/// day's units stay spent, while the refill the outage lasted is not charged again).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OutageUsage {
    /// Requests granted during the outage.
    pub requests: u64,
    /// Tokens used during the outage: reservations plus settlements.
    pub tokens: u64,
    /// How long before the reconciliation the outage began (on the process's own clock, so
    /// a skewed clock does not move it).
    pub began_ago: Duration,
}

impl OutageUsage {
    /// Nothing used (a reconciliation that only adopts or drops permits).
    pub const NONE: Self = Self { requests: 0, tokens: 0, began_ago: Duration::ZERO };

    /// `requests` and `tokens` used, the outage beginning `began_ago` before now.
    pub const fn new(requests: u64, tokens: u64, began_ago: Duration) -> Self {
        Self { requests, tokens, began_ago }
    }
}
