//! The status endpoint: each upstream's mode, state, limit, wave, permits in flight (this
//! process and the fleet), queue depth, breaker state and cooldown remaining, as JSON.

use actix_web::{HttpResponse, web};
use serde::Serialize;
use wavegate::{Scheduler, UpstreamStatus};

use crate::error::WebError;

/// One upstream in the status body.
#[derive(Debug, Serialize)]
pub struct UpstreamView {
    /// The upstream's name.
    pub upstream: String,
    /// `local`, `shared` or `fallback`.
    pub mode: &'static str,
    /// `NORMAL`, `COOLDOWN`, `PROBE` or `DEGRADED`.
    pub state: &'static str,
    /// The current limit.
    pub limit: u32,
    /// The configured limit (the limit in NORMAL).
    pub base_limit: u32,
    /// The current wave id.
    pub wave: u64,
    /// Milliseconds of cooldown left (0 outside COOLDOWN).
    pub cooldown_remaining_ms: u64,
    /// Permits held by this process.
    pub in_flight_local: usize,
    /// Permits held across the fleet (null when the shared store could not be read).
    pub in_flight_fleet: Option<u32>,
    /// Callers of this process waiting for a permit.
    pub queue_depth: usize,
    /// `closed`, `open` or `half_open`.
    pub breaker: &'static str,
    /// The requests-per-minute budget, if configured.
    pub requests_budget: Option<BudgetView>,
    /// The tokens-per-minute budget, if configured.
    pub tokens_budget: Option<BudgetView>,
}

/// What is left of a rate budget.
#[derive(Debug, Serialize)]
pub struct BudgetView {
    /// Units available now.
    pub remaining: u64,
    /// Milliseconds until one more unit is available (0 when full).
    pub next_refill_ms: u64,
}

impl BudgetView {
    fn new(value: Option<(u64, u64)>) -> Option<Self> {
        value.map(|(remaining, next_refill_ms)| Self { remaining, next_refill_ms })
    }
}

impl UpstreamView {
    fn new(status: UpstreamStatus, base_limit: u32) -> Self {
        Self {
            upstream: status.upstream,
            mode: status.mode.as_str(),
            state: status.state.as_str(),
            limit: status.limit,
            base_limit,
            wave: status.wave,
            cooldown_remaining_ms: status.cooldown_remaining.as_millis() as u64,
            in_flight_local: status.in_flight_local,
            in_flight_fleet: status.in_flight_fleet,
            queue_depth: status.queue_depth,
            breaker: status.breaker,
            requests_budget: BudgetView::new(status.budgets.requests),
            tokens_budget: BudgetView::new(status.budgets.tokens),
        }
    }
}

/// The status body.
#[derive(Debug, Serialize)]
pub struct StatusBody {
    /// Every configured upstream, in configuration order.
    pub upstreams: Vec<UpstreamView>,
}

/// Reads the scheduler's status.
pub async fn status(scheduler: &Scheduler) -> Result<StatusBody, WebError> {
    let statuses = scheduler.statuses().await?;
    let upstreams = statuses
        .into_iter()
        .zip(scheduler.upstreams())
        .map(|(status, config)| UpstreamView::new(status, config.limit().get()))
        .collect();
    Ok(StatusBody { upstreams })
}

/// The status handler. Needs the scheduler in `web::Data<Scheduler>`.
pub async fn status_handler(scheduler: web::Data<Scheduler>) -> Result<HttpResponse, WebError> {
    Ok(HttpResponse::Ok().json(status(&scheduler).await?))
}
