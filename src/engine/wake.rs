//! The one message a gate sends the lanes waiting on it.

use actix::Message;

/// Something may have freed a permit (a release in this process's gate, or one announced on
/// pub/sub): ask again.
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub(crate) struct Wake;
