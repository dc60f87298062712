//! The store's clock: the time its scripts read (`TIME`, Unix time in ms on the server's
//! host), on which a [`ServedSpan`](wavegate_core::ServedSpan) is given to the store.

use std::time::{SystemTime, UNIX_EPOCH};

use wavegate_core::duration_ms;

/// Unix time in ms, as this host's clock reads it now: the store's clock when Redis runs on
/// the same host, within the hosts' clock skew otherwise (a clock before 1970 reads 0).
pub fn store_now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, duration_ms)
}
