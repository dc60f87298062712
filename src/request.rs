//! An attempt's permit: admission by the upstream's supervisor (breaker, retry budget), then
//! a permit from the coordinator, both by messages. The call around it (`call.rs`) runs in the
//! caller's task.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use crate::error::Error;
use crate::messages::{Acquire, Admit, AttemptKind, Refusal};
use crate::permit::{Owners, Permit, QuotaRef};
use crate::scheduler::Inner;

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

/// Admission and a permit for one attempt.
pub(crate) async fn acquire_permit(
    inner: &Inner,
    upstream: usize,
    kind: AttemptKind,
    wait_until: Instant,
    tokens: u64,
    class: usize,
    tenant: Option<Arc<str>>,
) -> Result<Permit, Error> {
    let name = || inner.upstreams[upstream].name().to_string();
    if let Some(retry_after) = inner.quota[upstream].remaining() {
        // A spent quota: refused before the breaker, the queue and any wait.
        return Err(Error::quota_exhausted(name(), 0, retry_after));
    }
    let supervisor = inner.supervisors[upstream].clone();
    let admission = match supervisor.send(Admit { kind }).await {
        Ok(Ok(admission)) => admission,
        Ok(Err(Refusal::BreakerOpen(retry_after))) => return Err(Error::breaker_open(name(), retry_after)),
        Ok(Err(Refusal::BudgetSpent)) => {
            return Err(Error::retry_budget_spent(name(), 0, "transient"));
        }
        Err(_) => return Err(Error::stopped()),
    };
    let (reply, granted) = oneshot::channel();
    inner.coordinator.do_send(Acquire { upstream, tokens, class, tenant, deadline: wait_until, reply });
    let grant = granted.await.map_err(|_| Error::stopped())??;
    let quota = QuotaRef { block: inner.quota[upstream].clone(), pause: inner.upstreams[upstream].quota_pause() };
    let owners = Owners { coordinator: inner.coordinator.clone(), supervisor, quota };
    let permit = Permit::new(upstream, name(), grant, tokens, admission.into_ticket(), owners);
    if let Some(retry_after) = inner.quota[upstream].remaining() {
        // The quota ran out while this caller waited: the permit goes back unused.
        drop(permit);
        return Err(Error::quota_exhausted(name(), 0, retry_after));
    }
    Ok(permit)
}
