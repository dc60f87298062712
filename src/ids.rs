//! Permit ids, unique across the fleet: `<instance>:<sequence>`.
//!
//! The id is chosen by the client so that an acquire whose reply was lost can be sent again
//! without creating a second permit.

use rand::Rng;

/// Hands out permit ids for one process.
#[derive(Debug)]
pub(crate) struct PermitIds {
    instance: String,
    next: u64,
}

impl PermitIds {
    pub(crate) fn new() -> Self {
        // 128 random bits: pids repeat across containers (often 1), ids must not.
        let nonce: u128 = rand::rng().random();
        Self { instance: format!("{}-{nonce:032x}", std::process::id()), next: 0 }
    }

    /// This process's instance id (the prefix of its permit ids, its heartbeat's member).
    pub(crate) fn instance(&self) -> &str {
        &self.instance
    }

    pub(crate) fn next_id(&mut self) -> String {
        self.next += 1;
        format!("{}:{}", self.instance, self.next)
    }
}
