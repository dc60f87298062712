//! The one request type: what a caller asks an upstream for, from the request builder to the
//! gate and back.
//!
//! A [`Request`] is made by the builder (`Upstream::request()`, `Pool::request()`); each attempt
//! sends it to the upstream's lane with the kind of attempt and how long it may wait
//! ([`Acquire`](super::lane::Acquire)). The lane checks it once (its admission), names the
//! waiter with a [`PermitId`](wavegate_core::PermitId) that carries its class and tenant, and
//! offers it to the gate as an [`Ask`](wavegate_core::Ask); the gate's
//! [`Decision`](wavegate_core::Decision) names the same id.

use std::sync::Arc;

use wavegate_core::TenantTag;

use super::clock::Instant;

/// A priority class as a request names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ClassRef {
    /// The class at this index of the upstream's classes (0 without classes).
    Known(usize),
    /// A class the upstream does not have: refused by the lane's admission, before any wait.
    Unknown(Arc<str>),
}

/// What a request asks for beyond its upstream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Request {
    /// Its priority class.
    pub(crate) class: ClassRef,
    /// Its tenant within the class, if it names one: the tag of its key (the key itself is not
    /// kept).
    pub(crate) tenant: Option<TenantTag>,
    /// Tokens to reserve from the tokens budget for each attempt (0 without one).
    pub(crate) tokens: u64,
    /// When the whole request must be over; never later than the upstream's total timeout.
    pub(crate) deadline: Option<Instant>,
}

impl Request {
    /// A request in class `class` (the upstream's default), nothing else said.
    pub(crate) fn new(class: usize) -> Self {
        Self { class: ClassRef::Known(class), tenant: None, tokens: 0, deadline: None }
    }
}

/// Why an attempt asks for a permit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AttemptKind {
    /// The call's first attempt: deposits into the retry budget.
    First,
    /// A retry after a 429: it passes the shared cooldown like everyone else; not budgeted.
    AfterRateLimit,
    /// A retry after a transient failure: withdraws from the retry budget.
    AfterTransient,
}
