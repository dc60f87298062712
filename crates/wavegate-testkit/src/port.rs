//! Picking free TCP ports on 127.0.0.1.
//!
//! The kernel hands out a free port when binding port 0; the listener is then
//! closed and the port given to `redis-server`. Another process may grab the
//! port in between, which is why server startup retries on "Address already in
//! use". Within this process, every port handed out is remembered until its
//! [`PortReservation`] is dropped, so two servers started concurrently by
//! parallel tests never get the same port.

use std::collections::BTreeSet;
use std::io;
use std::net::{Ipv4Addr, TcpListener};
use std::sync::{Mutex, PoisonError};

/// Ports handed out by this process and not yet released.
static RESERVED: Mutex<BTreeSet<u16>> = Mutex::new(BTreeSet::new());

/// How many times the kernel is asked for a port that this process has not
/// already handed out.
const PICK_ATTEMPTS: usize = 64;

/// A port on 127.0.0.1 reserved for one server of this process.
///
/// Dropping it makes the port available to [`PortReservation::pick`] again.
#[derive(Debug)]
pub(crate) struct PortReservation {
    port: u16,
}

impl PortReservation {
    /// Asks the kernel for a free port that this process has not handed out.
    pub(crate) fn pick() -> io::Result<Self> {
        for _ in 0..PICK_ATTEMPTS {
            let port = {
                let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
                listener.local_addr()?.port()
            };
            if reserved().insert(port) {
                return Ok(Self { port });
            }
        }
        Err(io::Error::new(
            io::ErrorKind::AddrInUse,
            "the kernel kept handing out ports already reserved by this process",
        ))
    }

    /// The reserved port.
    pub(crate) fn port(&self) -> u16 {
        self.port
    }
}

impl Drop for PortReservation {
    fn drop(&mut self) {
        reserved().remove(&self.port);
    }
}

fn reserved() -> std::sync::MutexGuard<'static, BTreeSet<u16>> {
    RESERVED.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Returns a port on 127.0.0.1 that nothing listened on a moment ago.
///
/// Useful for "Redis is down from the start" tests: connecting to
/// `redis://127.0.0.1:{port}/` is refused. The port stays reserved for the
/// rest of the process, so no [`RedisServer`](crate::RedisServer) of this
/// process will ever listen on it (other processes still could).
///
/// # Errors
///
/// Fails if binding a socket on 127.0.0.1 fails.
pub fn free_port() -> io::Result<u16> {
    let reservation = PortReservation::pick()?;
    let port = reservation.port();
    // Keep the port out of the pool for good.
    std::mem::forget(reservation);
    Ok(port)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reservations_are_distinct_and_released_on_drop() {
        let a = PortReservation::pick().unwrap();
        let b = PortReservation::pick().unwrap();
        assert_ne!(a.port(), b.port());
        assert!(reserved().contains(&a.port()));
        let port = a.port();
        drop(a);
        assert!(!reserved().contains(&port));
        assert!(reserved().contains(&b.port()));
    }

    #[test]
    fn free_port_is_bindable_and_stays_reserved() {
        let port = free_port().unwrap();
        assert_ne!(port, 0);
        assert!(reserved().contains(&port));
        TcpListener::bind((Ipv4Addr::LOCALHOST, port)).unwrap();
    }
}
