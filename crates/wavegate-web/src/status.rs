//! The status endpoint: each upstream's mode, state, limit, wave, permits in flight (this
//! process and the fleet), queue depth, breaker state, cooldown remaining and a spent quota's
//! refusal, and the shared store's health (how it is found, the key prefix, the server, a
//! rejection, configuration conflicts), as JSON.

use serde::Serialize;
use wavegate::{Mode, Scheduler, UpstreamStatus};

use crate::error::WebError;

/// One upstream in the status body.
#[derive(Debug, Serialize)]
pub struct UpstreamView {
    /// The upstream's name.
    pub upstream: String,
    /// `local`, `shared`, `fallback` or `rejected`.
    pub mode: &'static str,
    /// `NORMAL`, `COOLDOWN`, `PROBE` or `DEGRADED`.
    pub state: &'static str,
    /// The current limit.
    pub limit: u32,
    /// The limit in NORMAL in force: the live one an operator set (`Upstream::set_limit`,
    /// `wavegate set`), else the configured one.
    pub base_limit: u32,
    /// The limit this process was configured with.
    pub configured_limit: u32,
    /// The version of the live settings this process applied (0: none ever set).
    pub live_version: u64,
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
    /// Milliseconds a caller joining the queue now may expect to wait: an estimate (see
    /// `wavegate::UpstreamStatus::expected_wait`); null while unknown.
    pub expected_wait_ms: Option<u64>,
    /// `closed`, `open` or `half_open`.
    pub breaker: &'static str,
    /// The requests-per-minute budget, if configured.
    pub requests_budget: Option<BudgetView>,
    /// The tokens-per-minute budget, if configured.
    pub tokens_budget: Option<BudgetView>,
    /// The requests limit the provider announced with a known window, as kept (the budget
    /// above is the configured one tightened by it); null when none is.
    pub learned_requests: Option<LearnedView>,
    /// The tokens limit the provider announced, likewise.
    pub learned_tokens: Option<LearnedView>,
    /// The input tokens limit the provider announced (Anthropic's ITPM), likewise.
    pub learned_input: Option<LearnedView>,
    /// The output tokens limit the provider announced (Anthropic's OTPM), likewise.
    pub learned_output: Option<LearnedView>,
    /// Milliseconds this process still refuses the upstream because the provider said its
    /// quota is exhausted (null when it does not).
    pub quota_exhausted_for_ms: Option<u64>,
    /// How many local-mode schedulers of this process name this upstream (0 in shared mode).
    pub schedulers_in_process: usize,
    /// What is wrong with the setup, if something is (e.g. several local schedulers for one
    /// upstream, each with a limit of its own).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub warning: Option<String>,
    /// The priority classes (left out when the upstream has none).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub classes: Vec<ClassView>,
    /// Shadow mode: left out when the upstream never ran in shadow in this process.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shadow: Option<ShadowView>,
}

/// What shadow mode recorded in this process: calls let through at once, and what their
/// ghosts met (how long they would have waited, which would have been refused and why).
#[derive(Debug, Serialize)]
pub struct ShadowView {
    /// Whether the whole upstream runs in shadow now.
    pub on: bool,
    /// The priority classes in shadow on their own now.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub classes: Vec<String>,
    /// Attempts let through in shadow.
    pub calls: u64,
    /// Ghosts granted a permit.
    pub would_have_granted: u64,
    /// Of those, granted after waiting 1 ms or more.
    pub would_have_waited: u64,
    /// Their mean wait, in milliseconds.
    pub mean_wait_ms: u64,
    /// The longest wait, in milliseconds.
    pub max_wait_ms: u64,
    /// Ghosts refused, by the refusal's code.
    pub would_have_refused: std::collections::BTreeMap<String, u64>,
    /// Ghosts still waiting.
    pub waiting: u64,
}

impl ShadowView {
    fn new(status: wavegate::ShadowStatus) -> Option<Self> {
        let off = !status.upstream && status.classes.is_empty();
        if off && status.calls == 0 {
            return None;
        }
        Some(Self {
            on: status.upstream,
            calls: status.calls,
            would_have_granted: status.would_have_granted,
            would_have_waited: status.would_have_waited,
            mean_wait_ms: status.mean_wait().as_millis() as u64,
            max_wait_ms: status.would_have_waited_max.as_millis() as u64,
            waiting: status.waiting,
            would_have_refused: status.would_have_refused,
            classes: status.classes,
        })
    }
}

/// One priority class: its configuration and this process's share of the load.
#[derive(Debug, Serialize)]
pub struct ClassView {
    /// The class's name.
    pub class: String,
    /// Its weight.
    pub weight: u32,
    /// Its reserved share of the limit, in percent.
    pub reserve_percent: u8,
    /// The most of the upstream's rate budgets it may use, in percent (100: no cap).
    pub budget_percent: u8,
    /// Callers of this process waiting in it.
    pub waiting: usize,
    /// Milliseconds a caller joining it now may expect to wait: an estimate; null while
    /// unknown.
    pub expected_wait_ms: Option<u64>,
    /// Permits of it this process holds.
    pub in_flight_local: usize,
    /// Permits of it held across the fleet (shared mode).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub in_flight_fleet: Option<u32>,
    /// Callers of it waiting across the fleet (shared mode).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub waiting_fleet: Option<u32>,
}

/// What is left of a rate budget.
#[derive(Debug, Serialize)]
pub struct BudgetView {
    /// Units available now.
    pub remaining: u64,
    /// Milliseconds until one more unit is available (0 when full).
    pub next_refill_ms: u64,
}

/// A limit the provider announced, as kept.
#[derive(Debug, Serialize)]
pub struct LearnedView {
    /// Units (requests or tokens) per window.
    pub limit: u64,
    /// The window, in milliseconds.
    pub window_ms: u64,
    /// The budget it means, per minute (before the configuration's ceiling).
    pub per_minute: u32,
    /// Milliseconds until it is forgotten unless the provider says it again.
    pub forgotten_in_ms: u64,
}

impl LearnedView {
    fn new(value: Option<wavegate::dev::LearnedLimitStatus>) -> Option<Self> {
        value.map(|s| Self {
            limit: s.limit.limit,
            window_ms: s.limit.window_ms,
            per_minute: s.limit.budget().per_minute(),
            forgotten_in_ms: s.forgotten_in.as_millis() as u64,
        })
    }
}

impl BudgetView {
    fn new(value: Option<(u64, u64)>) -> Option<Self> {
        value.map(|(remaining, next_refill_ms)| Self { remaining, next_refill_ms })
    }
}

impl UpstreamView {
    fn new(status: UpstreamStatus) -> Self {
        let warning = warning(status.mode, status.schedulers_in_process);
        Self {
            upstream: status.upstream,
            mode: status.mode.as_str(),
            state: status.state.as_str(),
            limit: status.limit,
            base_limit: status.base_limit,
            configured_limit: status.configured_limit,
            live_version: status.live_version,
            wave: status.wave,
            cooldown_remaining_ms: status.cooldown_remaining.as_millis() as u64,
            in_flight_local: status.in_flight_local,
            in_flight_fleet: status.in_flight_fleet,
            queue_depth: status.queue_depth,
            expected_wait_ms: status.expected_wait.map(|wait| wait.as_millis() as u64),
            breaker: status.breaker,
            requests_budget: BudgetView::new(status.budgets.requests),
            tokens_budget: BudgetView::new(status.budgets.tokens),
            learned_requests: LearnedView::new(status.learned.requests),
            learned_tokens: LearnedView::new(status.learned.tokens),
            learned_input: LearnedView::new(status.learned.input),
            learned_output: LearnedView::new(status.learned.output),
            quota_exhausted_for_ms: status.quota_exhausted_for.map(|left| left.as_millis() as u64),
            schedulers_in_process: status.schedulers_in_process,
            warning,
            shadow: ShadowView::new(status.shadow),
            classes: status
                .classes
                .into_iter()
                .map(|c| ClassView {
                    class: c.class,
                    weight: c.weight,
                    reserve_percent: c.reserve_percent,
                    budget_percent: c.budget_percent,
                    waiting: c.waiting,
                    expected_wait_ms: c.expected_wait.map(|wait| wait.as_millis() as u64),
                    in_flight_local: c.in_flight_local,
                    in_flight_fleet: c.in_flight_fleet,
                    waiting_fleet: c.waiting_fleet,
                })
                .collect(),
        }
    }
}

/// What is wrong with the setup of one upstream, if something is.
fn warning(mode: Mode, schedulers_in_process: usize) -> Option<String> {
    if schedulers_in_process > 1 {
        return Some(format!(
            "{} local-mode schedulers in this process name this upstream (built inside HttpServer::new's \
             factory?): they share one limit, but each runs its own actors. Build the scheduler once and clone it",
            schedulers_in_process
        ));
    }
    if cfg!(not(feature = "redis")) && mode != Mode::Local {
        return Some(
            "the scheduler uses Redis but wavegate-web was built without its `redis` feature, so this status leaves \
             out the shared store (`store`): enable wavegate-web's `redis` feature"
                .to_string(),
        );
    }
    None
}

/// The status body.
#[derive(Debug, Serialize)]
pub struct StatusBody {
    /// Every configured upstream, in configuration order.
    pub upstreams: Vec<UpstreamView>,
    /// The shared store (left out in local mode, and without this crate's `redis` feature).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub store: Option<StoreView>,
}

/// The shared store as the scheduler knows it (`Scheduler::store_health`).
#[derive(Debug, Serialize)]
pub struct StoreView {
    /// `single`, `sentinel` or `cluster`.
    pub topology: &'static str,
    /// The prefix of every key and channel.
    pub key_prefix: String,
    /// The server's name and version, once the startup check read them.
    pub server: Option<String>,
    /// Behind Sentinel: the primary in use.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub primary: Option<String>,
    /// Why the server rejects wavegate now (`authentication`, `permission`, `version`, `tls`,
    /// `sentinel`), with its words and what to do.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rejected: Option<RejectionView>,
    /// Upstreams another process shares with a different configuration.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub config_conflicts: Vec<String>,
}

/// A rejection of wavegate by the server.
#[derive(Debug, Serialize)]
pub struct RejectionView {
    /// `authentication`, `permission`, `version`, `tls` or `sentinel`.
    pub reason: &'static str,
    /// The server's words.
    pub detail: String,
    /// What to change.
    pub advice: &'static str,
}

#[cfg(feature = "redis")]
impl StoreView {
    fn new(health: wavegate::StoreHealth) -> Self {
        Self {
            topology: health.topology,
            key_prefix: health.key_prefix,
            server: health.server,
            primary: health.primary,
            rejected: health.rejected.map(|(reason, detail)| RejectionView {
                reason: reason.as_str(),
                detail,
                advice: reason.advice(),
            }),
            config_conflicts: health.config_conflicts.into_keys().collect(),
        }
    }
}

/// Reads the scheduler's status.
pub async fn status(scheduler: &Scheduler) -> Result<StatusBody, WebError> {
    let statuses = scheduler.statuses().await?;
    let upstreams = statuses.into_iter().map(UpstreamView::new).collect();
    Ok(StatusBody { upstreams, store: store(scheduler) })
}

#[cfg(feature = "redis")]
fn store(scheduler: &Scheduler) -> Option<StoreView> {
    scheduler.store_health().map(StoreView::new)
}

/// Without the `redis` feature this crate cannot read the store (a scheduler in shared mode
/// then says so in its upstreams' `warning`).
#[cfg(not(feature = "redis"))]
fn store(_: &Scheduler) -> Option<StoreView> {
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shared_scheduler_without_the_redis_feature_is_a_warning() {
        assert_eq!(warning(Mode::Local, 1), None);
        assert_eq!(warning(Mode::Shared, 0).is_some(), cfg!(not(feature = "redis")));
        assert_eq!(warning(Mode::Fallback, 0).is_some(), cfg!(not(feature = "redis")));
        if let Some(warning) = warning(Mode::Shared, 0) {
            assert!(warning.contains("`redis` feature"), "{warning}");
        }
        assert!(warning(Mode::Local, 2).is_some_and(|w| w.starts_with("2 local-mode schedulers")));
    }
}
