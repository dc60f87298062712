//! The one message a gate sends the lanes waiting on it.

use actix::Message;
use wavegate_core::{PermitId, WaveState};

/// Something may have freed a permit (a release in this process's gate, or one announced on
/// pub/sub): ask again. When the release granted the freed permit to this lane's last ask at
/// the limit in the same step (the hand-off), the wake-up carries it.
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub(crate) struct Wake {
    /// The permit handed to this lane, if any.
    pub(crate) handed: Option<Handed>,
}

impl Wake {
    /// A wake-up without a permit: ask again.
    pub(crate) const ASK: Wake = Wake { handed: None };
}

/// A permit a release granted to a lane's last ask at the limit: held by the gate that granted
/// it from the release on, under that ask's id.
#[derive(Debug)]
pub(crate) struct Handed {
    /// The ask's id.
    pub(crate) id: PermitId,
    /// The wave it was granted in, the wave's state and the limit then.
    pub(crate) wave: u64,
    pub(crate) state: WaveState,
    pub(crate) limit: u32,
    /// The gate that granted it.
    pub(crate) by: HandedBy,
}

/// Which gate granted a [`Handed`] permit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HandedBy {
    /// The shared store.
    Store,
    /// An in-process gate, by its number (a lane takes the permit only from the gate in charge).
    Local(u64),
}
