//! What a process used while another gate was in charge (its fallback through a store outage),
//! charged back to the shared budgets at the reconciliation ([`LocalGate::charge`](crate::LocalGate::charge);
//! `lua/reconcile.lua` is the twin).

use std::time::Duration;

use crate::gate::DayLeft;

/// Requests and tokens used during an outage, the latest start they can be charged from, and
/// what the process last heard is left of the day: the per-minute budgets take the usage up to
/// empty at most, the day budgets as used from that start (a day's units stay spent, while the
/// refill the usage's times allow is not charged again: [`ChargeStart`](crate::ChargeStart)),
/// after a day the store forgot takes back `day_left`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OutageUsage {
    /// Requests granted during the outage.
    pub requests: u64,
    /// Tokens used during the outage: reservations plus settlements.
    pub tokens: u64,
    /// How long before the reconciliation the usage can be charged from to the day budgets: the
    /// latest start its grants' times allow ([`ChargeStart`](crate::ChargeStart); on the
    /// process's own clock, so a skewed clock does not move it).
    pub began_ago: Duration,
    /// What this process last heard is left of the day budgets, as of the reconciliation and
    /// before this usage ([`DayLeft::at`]): a store that lost the state the process heard it
    /// of (`FLUSHALL`, an empty restart) leaves its days at most that much
    /// ([`LocalGate::carry_back_day`](crate::LocalGate::carry_back_day); the shared store
    /// compares the generation the process last saw with its own).
    pub day_left: Option<DayLeft>,
    /// This usage's identity (0: none): a store that charged a usage of this id already (a
    /// reconciliation whose reply was lost, tried again) does not charge it twice.
    pub id: u64,
}

impl OutageUsage {
    /// Nothing used (a reconciliation that only adopts or drops permits).
    pub const NONE: Self = Self { requests: 0, tokens: 0, began_ago: Duration::ZERO, day_left: None, id: 0 };

    /// `requests` and `tokens` used, chargeable from `began_ago` before now.
    pub const fn new(requests: u64, tokens: u64, began_ago: Duration) -> Self {
        Self { requests, tokens, began_ago, day_left: None, id: 0 }
    }

    /// The same, with an identity ([`id`](Self::id)): charged once however often it is sent.
    pub const fn with_id(self, id: u64) -> Self {
        Self { id, ..self }
    }

    /// The same, carrying back what this process last heard is left of the day.
    pub const fn with_day_left(self, day_left: Option<DayLeft>) -> Self {
        Self { day_left, ..self }
    }
}
