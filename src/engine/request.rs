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
    /// The upstream's default class.
    Default,
    /// The class of this name: resolved by the lane's admission, which refuses a class the
    /// upstream does not have before any wait (a pool's members may have different classes).
    Named(Arc<str>),
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
    /// Of `tokens`, the answer's output (its `max_tokens`): for an output tokens budget.
    pub(crate) output: u64,
    /// When the whole request must be over; never later than the upstream's total timeout.
    pub(crate) deadline: Option<Instant>,
    /// In shadow mode, this attempt is a retry its call's first ghost stands for
    /// (`Grant::shadow_covers_retry`): it goes with a pass and no ghost of its own. Ignored
    /// when the upstream no longer runs in shadow.
    pub(crate) shadow_covered: bool,
}

impl Default for Request {
    /// A request in the upstream's default class, nothing else said.
    fn default() -> Self {
        Self { class: ClassRef::Default, tenant: None, tokens: 0, output: 0, deadline: None, shadow_covered: false }
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
