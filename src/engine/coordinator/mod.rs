//! The coordinator actor: what is fleet-wide, not per upstream — the shared store's failure
//! domains and their modes, the heartbeat (how many processes share the limits), the release
//! channels' subscriber, the configuration claims. It tells each lane which gate is in charge.
//!
//! * **Modes** (`modes.rs`): shared → local fallback on a store outage (timeout, refused or
//!   dropped connection, BUSY, LOADING, auth) → reconcile → shared, per failure domain
//!   (`domains.rs`: the whole store on one server, each upstream on a Cluster). No caller code
//!   changes; calls in progress are not failed by a switch.
//! * **Heartbeat**: every second in shared mode, so each process knows how many share a limit
//!   (its fallback share).
//! * **Wake-ups** (`pubsub.rs`): a release anywhere wakes the process it names.
//!
//! In local mode (no store) it has nothing to do.

mod actor;
mod config_claims;
mod domains;
mod modes;
#[cfg(feature = "redis")]
mod pubsub;
mod rejection;

#[cfg(feature = "redis")]
pub(crate) use actor::HEARTBEAT_TTL;
pub(crate) use actor::{Coordinator, ReadLive};
