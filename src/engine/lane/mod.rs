//! A lane: one upstream's actor. It is the upstream's supervisor (its circuit breaker and
//! retry budget) and owns everything one upstream's permits need in this process — its waiters,
//! the permits it holds, the gate in charge and the epoch of that gate, the acquire loop, the
//! releases, the lease watchdog.
//!
//! * **Admission** (`admission.rs`): every attempt is checked once, in one place — spent quota,
//!   breaker and retry budget, unknown class, an estimate that never fits, a full queue — then
//!   waits in the lane's queue.
//! * **Deadlines** (`deadline.rs`): a caller whose wait bound comes before the earliest a
//!   permit can come, as proved by what the lane knows, is refused at once.
//! * **Acquire loop** (`pump.rs`): serves the heads of the queue, one gate call at a time; only
//!   the heads are asked for, so the store's load grows with processes, not waiting callers.
//! * **Releases** (`release.rs`): a permit's outcome goes to the gate in charge; a call
//!   cancelled at the provider keeps its permit until the provider has plausibly finished.
//! * **Spent quotas** (`quota.rs`): told to the fleet and heard from it.
//! * **Shadow mode** (`shadow.rs`): a call in shadow is let through at once; its ghost asks
//!   for the permit in its place and records what enforcing would have done.
//! * **Windows** (`windows.rs`): an operator's clear of the provider's windows.
//! * **Live settings** (`live.rs`): an operator's change of the limit, from the store (or the
//!   in-process board in local mode), looked at every second and when a change is announced.
//! * **Modes** (`outage.rs`): the coordinator tells the lane which gate is in charge (shared,
//!   or this process's fallback share) and asks it to reconcile when the store is back.

mod actor;
mod admission;
mod book;
mod day_usage;
mod deadline;
mod expected;
mod gauges;
mod live;
pub(crate) mod messages;
mod outage;
mod pace;
mod pump;
mod quota;
mod release;
mod sampler;
mod shadow;
mod status;
mod tally;
mod waiters;
mod windows;

pub(crate) use actor::{Lane, LaneSetup};
pub(crate) use live::ChangeLive;
#[cfg(feature = "redis")]
pub(crate) use live::CheckLive;
pub(crate) use messages::{Acquire, ClearWindows, DRAIN_BOUND, Drain, DrainReply, ReadMode, ReadStatus, StoreTrouble};
pub(crate) use outage::{Reconcile, Switch};
pub(crate) use status::{Headroom, ReadHeadroom};
