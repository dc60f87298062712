//! The messages a lane answers (and the one it sends the coordinator).

use actix::Message;
use tokio::sync::oneshot;

use crate::engine::clock::Instant;
use crate::engine::grant::Grant;
use crate::engine::request::{AttemptKind, Request};
use crate::engine::store::StoreError;
use crate::error::Error;
use crate::status::{Mode, UpstreamStatus};

/// The longest a drain waits for releases on their way to the shared store.
pub(crate) const DRAIN_BOUND: std::time::Duration = std::time::Duration::from_secs(1);

/// Queue for a permit of this lane's upstream until `wait_until`; the answer comes on `reply`.
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub(crate) struct Acquire {
    pub(crate) request: Request,
    pub(crate) kind: AttemptKind,
    pub(crate) wait_until: Instant,
    pub(crate) reply: oneshot::Sender<Result<Grant, Error>>,
}

/// Forget the provider's windows (an operator's clear): in the shared store for the fleet, and
/// in this process's gate. Answers once the gate in charge has forgotten them.
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub(crate) struct ClearWindows {
    pub(crate) reply: oneshot::Sender<Result<(), Error>>,
}

/// Read the upstream's status as this process sees it (the shared store's part included).
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub(crate) struct ReadStatus {
    pub(crate) reply: oneshot::Sender<UpstreamStatus>,
}

/// The mode of this lane's upstream.
#[derive(Debug, Message)]
#[rtype(result = "Mode")]
pub(crate) struct ReadMode;

/// Answered once no release of this lane is on its way to the shared store (at once in local
/// mode, or after [`DRAIN_BOUND`]).
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub(crate) struct Drain {
    pub(crate) reply: DrainReply,
}

/// Where a [`Drain`]'s answer goes: a thread that blocks on it (the last handle's drop), or a
/// task that awaits it (`Scheduler::shutdown`).
#[derive(Debug)]
pub(crate) enum DrainReply {
    Blocking(std::sync::mpsc::Sender<()>),
    Async(oneshot::Sender<()>),
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

/// A store call of lane `upstream`, made under `epoch`, failed: the coordinator decides what
/// it means for the failure domain (an outage switches it to fallback).
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub(crate) struct StoreTrouble {
    pub(crate) upstream: usize,
    pub(crate) epoch: u64,
    pub(crate) command: &'static str,
    pub(crate) error: StoreError,
}
