//! One attempt's permit: the engine's grant for a request, as the caller's [`Permit`]. The
//! call around it (`call.rs`) runs in the caller's task.

use std::time::Duration;

use crate::engine::clock::Instant;
use crate::engine::request::{AttemptKind, Request};
use crate::error::Error;
use crate::handle::Inner;
use crate::permit::{Permit, QuotaRef};

/// What the caller's closure learns about the attempt it is asked to make.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Attempt {
    /// 1 for the first attempt, 2 for the first retry, ...
    pub number: u32,
    /// The wave the attempt's permit was issued in.
    pub wave: u64,
    /// How long this attempt may run (the call timeout, or less near the deadline).
    pub timeout: Duration,
    /// How long this attempt waited for its permit (queue wait plus permit wait).
    pub waited: Duration,
}

/// A permit of `upstream` for one attempt of `request`, waiting at most until `wait_until`
/// (the lane checks the attempt once: quota, breaker, retry budget, class, estimate, queue).
pub(crate) async fn acquire_permit(
    inner: &Inner,
    upstream: usize,
    request: &Request,
    kind: AttemptKind,
    wait_until: Instant,
) -> Result<Permit, Error> {
    let grant = inner.engine.acquire(upstream, request.clone(), kind, wait_until).await?;
    let config = &inner.upstreams[upstream];
    let quota = QuotaRef {
        block: inner.quota[upstream].clone(),
        pause: config.quota_pause(),
        retry_after_cap: config.wave().cooldown.max(),
        keeps_estimate: config.keeps_estimate(),
        cache_read_weight: config.cache_read_weight(),
    };
    Ok(Permit::new(grant, inner.names[upstream].clone(), quota))
}
