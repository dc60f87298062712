//! What a process asks a gate for, and the gate's answer, which names the ask it answers.
//!
//! A process asks for one permit at a time on behalf of its waiting callers: one [`Ask`] per
//! head it offers (one per priority class, or per tenant within a class), each carrying the
//! waiter's [`PermitId`] (which names its class and tenant), its token estimate and how many of
//! the process's callers it stands for. Both gates — the in-process one
//! ([`LocalGate`](crate::LocalGate)) and the Redis scripts — take the same asks and give the
//! same [`Decision`]: a grant names the ask it grants; a denial names the ask it refuses (the
//! one the fleet-wide choice reached, else the first), so a waiter is only ever failed by a
//! reply that names it.

use crate::permit_id::PermitId;
use crate::wave::{Admission, DenyReason, WaveState};

/// One head of a process's waiting callers, as a gate is asked for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ask {
    /// The waiter's permit id (its class and tenant inside).
    pub id: PermitId,
    /// Tokens to reserve from the tokens budget (0 without one).
    pub tokens: u64,
    /// Of [`tokens`](Self::tokens), how many are the answer's output (the request's
    /// `max_tokens`): reserved from the output tokens budget, the rest from the input one
    /// ([`Budgets`](crate::Budgets)). Above `tokens` it counts as `tokens`.
    pub output: u64,
    /// How many of the process's callers it stands for, itself included (its class's callers
    /// without tenants, its tenant's callers within the class with them); at least 1.
    pub waiting: u32,
}

/// A gate's answer to an acquire.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// The permit of ask `id` is granted, in `wave`.
    Granted {
        /// The ask granted.
        id: PermitId,
        /// The wave the permit is issued in; its outcome is reported against it.
        wave: u64,
        /// The state at the grant.
        state: WaveState,
        /// The limit at the grant.
        limit: u32,
        /// Permits held after the grant (across the fleet in shared mode).
        in_flight: u32,
    },
    /// Not now, or (for [`DenyReason::TokensExceedBurst`]) never, for ask `id`.
    Denied {
        /// The ask refused: the one the choice reached, else the first asked.
        id: PermitId,
        /// Why.
        reason: DenyReason,
        /// How long until asking again can succeed (0: only a release can make room).
        retry_after_ms: u64,
        /// Permits held (across the fleet in shared mode).
        in_flight: u32,
    },
}

impl Decision {
    /// The answer `admission` to ask `id`, with `in_flight` permits held after it.
    pub fn new(id: PermitId, admission: Admission, in_flight: u32) -> Self {
        match admission {
            Admission::Granted { wave, state, limit } => Decision::Granted { id, wave, state, limit, in_flight },
            Admission::Denied { reason, retry_after_ms } => Decision::Denied { id, reason, retry_after_ms, in_flight },
        }
    }

    /// A denial of ask `id`.
    pub fn denied_for(id: PermitId, reason: DenyReason, retry_after_ms: u64, in_flight: u32) -> Self {
        Decision::Denied { id, reason, retry_after_ms, in_flight }
    }

    /// The answer without the id: granted in which wave, or denied why.
    pub fn admission(&self) -> Admission {
        match *self {
            Decision::Granted { wave, state, limit, .. } => Admission::Granted { wave, state, limit },
            Decision::Denied { reason, retry_after_ms, .. } => Admission::Denied { reason, retry_after_ms },
        }
    }

    /// Whether it grants the permit.
    pub fn is_granted(&self) -> bool {
        matches!(self, Decision::Granted { .. })
    }

    /// The ask it answers.
    pub fn id(&self) -> &PermitId {
        match self {
            Decision::Granted { id, .. } | Decision::Denied { id, .. } => id,
        }
    }

    /// Permits held after it.
    pub fn in_flight(&self) -> u32 {
        match self {
            Decision::Granted { in_flight, .. } | Decision::Denied { in_flight, .. } => *in_flight,
        }
    }
}
