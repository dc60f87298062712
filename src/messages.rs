//! The messages the actors exchange (a call, as messages; the call is a future in the
//! caller's task):
//!
//! ```text
//! call ── Admit ──► UpstreamSupervisor          breaker closed? retry budget left?
//! call ── Acquire ──► Coordinator ── acquire script ──► Redis (or the local gate)
//!      ◄─ Grant | Error (queue full, waited too long)
//! call runs the caller's future under the call timeout, in the caller's task
//! call ── Finish ──► Coordinator (release + report the wave)
//!      ── Record ──► UpstreamSupervisor (breaker)
//! ```

use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::Message;
use tokio::sync::oneshot;
use wavegate_core::{BreakerState, BreakerTicket, CallResult, WaveSignal, WaveState, WindowReport};

use crate::error::Error;
use crate::status::{Mode, UpstreamStatus};

/// Why an attempt asks for admission.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AttemptKind {
    /// The call's first attempt: deposits into the retry budget.
    First,
    /// A retry after a 429: it passes the shared cooldown like everyone else; not budgeted.
    AfterRateLimit,
    /// A retry after a transient failure: withdraws from the retry budget.
    AfterTransient,
}

/// Ask the supervisor whether an attempt may go ahead.
#[derive(Debug, Message)]
#[rtype(result = "Result<crate::permit::Admission, Refusal>")]
pub(crate) struct Admit {
    pub(crate) kind: AttemptKind,
}

/// Why the supervisor refused an attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// The breaker is open for this long.
    BreakerOpen(Duration),
    /// The retry budget is spent.
    BudgetSpent,
}

/// Tell the supervisor how an admitted attempt went.
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub(crate) struct Record {
    pub(crate) ticket: BreakerTicket,
    pub(crate) result: CallResult,
}

/// Read the breaker's state.
#[derive(Debug, Message)]
#[rtype(result = "BreakerState")]
pub(crate) struct ReadBreaker;

/// A granted permit, as the coordinator hands it out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Grant {
    pub(crate) id: String,
    pub(crate) wave: u64,
    pub(crate) state: WaveState,
    pub(crate) limit: u32,
    /// Time in the local FIFO behind other waiters.
    pub(crate) queue_wait: Duration,
    /// Time at the head of the FIFO until the limit (or a cooldown) let it through.
    pub(crate) permit_wait: Duration,
}

/// Queue for a permit of upstream `upstream` until `deadline`; the answer comes on `reply`.
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub(crate) struct Acquire {
    pub(crate) upstream: usize,
    /// Tokens to reserve from the tokens budget (0 without one).
    pub(crate) tokens: u64,
    /// Its priority class (index in the upstream's classes; 0 without classes).
    pub(crate) class: usize,
    /// Its tenant within the class, if it names one.
    pub(crate) tenant: Option<Arc<str>>,
    pub(crate) deadline: Instant,
    pub(crate) reply: oneshot::Sender<Result<Grant, Error>>,
}

/// Release permit `id` and report its outcome for its wave.
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub(crate) struct Finish {
    pub(crate) upstream: usize,
    pub(crate) id: String,
    pub(crate) wave: u64,
    pub(crate) signal: WaveSignal,
    /// Tokens used beyond the reservation (negative: fewer).
    pub(crate) token_delta: i64,
    /// What the response said is left of the provider's windows, if anything.
    pub(crate) window: Option<WindowReport>,
    /// Tokens the call reserved (the others in flight are assumed to reserve as much).
    pub(crate) tokens_reserved: u64,
}

/// Something may have freed a permit of `upstream` (a release announced on pub/sub).
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub(crate) struct Wake {
    pub(crate) upstream: usize,
}

/// Read one upstream's scheduling state (the breaker part comes from the supervisor).
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub(crate) struct ReadStatus {
    pub(crate) upstream: usize,
    pub(crate) reply: oneshot::Sender<UpstreamStatus>,
}

/// Answered once no release is on its way to the shared store (at once in local mode, or
/// after the coordinator's bound): the last handle's drop and `Scheduler::shutdown` wait for
/// it, so a process that exits right after its last call leaves no permit behind for a lease.
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub(crate) struct Drain {
    pub(crate) reply: DrainReply,
}

/// Where a [`Drain`]'s answer goes: a thread that blocks on it (the last handle's drop), or
/// a task that awaits it (`Scheduler::shutdown`).
#[derive(Debug)]
pub(crate) enum DrainReply {
    Blocking(std::sync::mpsc::Sender<()>),
    Async(tokio::sync::oneshot::Sender<()>),
}

impl DrainReply {
    /// Answers (a waiter that gave up is no matter).
    pub(crate) fn send(self) {
        match self {
            DrainReply::Blocking(reply) => drop(reply.send(())),
            DrainReply::Async(reply) => drop(reply.send(())),
        }
    }
}

/// The mode of one upstream, or (`None`) the process's: the least shared of its upstreams'.
#[derive(Debug, Message)]
#[rtype(result = "Mode")]
pub(crate) struct ReadMode {
    pub(crate) upstream: Option<usize>,
}
