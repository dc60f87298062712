//! Every metric wavegate records: one place for the names, the labels and the histogram
//! buckets, and thin functions the actors call.
//!
//! Metrics go through the [`metrics`] facade: install any recorder (wavegate-web installs the
//! Prometheus one with [`HISTOGRAM_BUCKETS`]). Labels only ever hold configured upstream names
//! and fixed vocabularies (outcomes, reasons, states, modes), so their number is bounded.

use std::time::Duration;

use metrics::{counter, gauge, histogram};
use wavegate_core::{BudgetStatus, WaveState};

use crate::status::Mode;

/// Permits held, `scope` = `local` (this process) or `fleet` (all processes, last seen).
pub const PERMITS_IN_FLIGHT: &str = "wavegate_permits_in_flight";
/// Time from asking for a permit to getting it, seconds (histogram).
pub const PERMIT_WAIT_SECONDS: &str = "wavegate_permit_wait_seconds";
/// Permits a release granted to this process's waiter in the same step (the hand-off): the
/// waiter needed no acquire of its own.
pub const PERMITS_HANDED_TOTAL: &str = "wavegate_permits_handed_total";
/// Time in the local FIFO behind other waiters, seconds (histogram).
pub const QUEUE_WAIT_SECONDS: &str = "wavegate_queue_wait_seconds";
/// Callers of this process waiting for a permit.
pub const QUEUE_DEPTH: &str = "wavegate_queue_depth";
/// Upstream call time by `outcome`, seconds (histogram).
pub const UPSTREAM_CALL_SECONDS: &str = "wavegate_upstream_call_seconds";
/// The current concurrency limit.
pub const LIMIT: &str = "wavegate_limit";
/// The current wave id.
pub const WAVE: &str = "wavegate_wave";
/// 1 for the current wave `state`, 0 for the others.
pub const WAVE_STATE: &str = "wavegate_wave_state";
/// 429s reported.
pub const RATE_LIMITED_TOTAL: &str = "wavegate_rate_limited_total";
/// 429s that cut the limit and started a wave.
pub const LIMIT_CUTS_TOTAL: &str = "wavegate_limit_cuts_total";
/// 429s of an older wave, ignored.
pub const LATE_RATE_LIMITS_IGNORED_TOTAL: &str = "wavegate_late_rate_limits_ignored_total";
/// 1 for the breaker's current `state`, 0 for the others.
pub const BREAKER_STATE: &str = "wavegate_breaker_state";
/// Breaker state changes, by `from` and `to`.
pub const BREAKER_TRANSITIONS_TOTAL: &str = "wavegate_breaker_transitions_total";
/// Retries, by `reason` (`rate_limited`, `transient`).
pub const RETRIES_TOTAL: &str = "wavegate_retries_total";
/// Retries refused by the retry budget.
pub const RETRY_BUDGET_REFUSALS_TOTAL: &str = "wavegate_retry_budget_refusals_total";
/// Calls refused for overload, by `reason` (`waited_too_long`, `queue_full`, `breaker_open`,
/// `retry_budget_spent`).
pub const OVERLOAD_REFUSALS_TOTAL: &str = "wavegate_overload_refusals_total";
/// 1 for the current `mode`, 0 for the others: with an `upstream` label, that upstream's mode;
/// without one, the process's (the least shared of its upstreams': `fallback` as soon as one
/// is, e.g. behind one lost master of a Cluster).
pub const MODE: &str = "wavegate_mode";
/// Mode changes of each `upstream`, by `from` and `to`.
pub const MODE_CHANGES_TOTAL: &str = "wavegate_mode_changes_total";
/// Shared store errors, by `command` and `kind`.
pub const REDIS_ERRORS_TOTAL: &str = "wavegate_redis_errors_total";
/// Permits reconciled after an outage, by `action` (`adopted`, `dropped`).
pub const RECONCILED_PERMITS_TOTAL: &str = "wavegate_reconciled_permits_total";
/// Permits granted locally during an outage (usage handed to the shared store on recovery).
pub const OUTAGE_GRANTS_TOTAL: &str = "wavegate_outage_grants_total";
/// Callers of this process waiting for a permit, by priority `class` (upstreams with classes).
pub const CLASS_WAITING: &str = "wavegate_class_waiting";
/// Permits this process holds, by priority `class` (upstreams with classes).
pub const CLASS_IN_FLIGHT: &str = "wavegate_class_in_flight";
/// Permits granted, by priority `class` (upstreams with classes).
pub const CLASS_GRANTS_TOTAL: &str = "wavegate_class_grants_total";
/// Time at the head of its class's queue until the permit came, by priority `class`, seconds
/// (histogram; upstreams with classes).
pub const CLASS_PERMIT_WAIT_SECONDS: &str = "wavegate_class_permit_wait_seconds";

/// The version of the upstream's live settings this process applied (0: none ever set);
/// see `Upstream::set_limit`.
pub const LIVE_VERSION: &str = "wavegate_live_version";
/// Callers refused before their wait bound because no permit could come by then (a cooldown,
/// a spent provider window, a rate budget without room, as proved), by `reason` (`cooldown`,
/// `provider_window`, `requests`, `tokens`). Also counted in the overload refusals
/// (`waited_too_long`).
pub const REFUSED_EARLY_TOTAL: &str = "wavegate_refused_early_total";
/// The expected wait of a caller joining the queue now, by priority `class` (`""` without
/// classes: the upstream as a whole), seconds, refreshed every second: an estimate (see
/// `UpstreamStatus::expected_wait`), NaN while unknown.
pub const EXPECTED_WAIT_SECONDS: &str = "wavegate_expected_wait_seconds";

/// Every metric name above.
pub const ALL: &[&str] = &[
    PERMITS_IN_FLIGHT,
    PERMIT_WAIT_SECONDS,
    PERMITS_HANDED_TOTAL,
    QUEUE_WAIT_SECONDS,
    QUEUE_DEPTH,
    UPSTREAM_CALL_SECONDS,
    LIMIT,
    WAVE,
    WAVE_STATE,
    RATE_LIMITED_TOTAL,
    LIMIT_CUTS_TOTAL,
    LATE_RATE_LIMITS_IGNORED_TOTAL,
    BREAKER_STATE,
    BREAKER_TRANSITIONS_TOTAL,
    RETRIES_TOTAL,
    RETRY_BUDGET_REFUSALS_TOTAL,
    OVERLOAD_REFUSALS_TOTAL,
    MODE,
    MODE_CHANGES_TOTAL,
    REDIS_ERRORS_TOTAL,
    RECONCILED_PERMITS_TOTAL,
    CLASS_WAITING,
    CLASS_IN_FLIGHT,
    CLASS_GRANTS_TOTAL,
    CLASS_PERMIT_WAIT_SECONDS,
    OUTAGE_GRANTS_TOTAL,
    BUDGET_REMAINING,
    BUDGET_NEXT_REFILL_SECONDS,
    BUDGET_WAITS_TOTAL,
    LEARNED_LIMIT_PER_MINUTE,
    RELEASED_AFTER_LEASE_TOTAL,
    REFUSALS_BY_KIND_TOTAL,
    UNREADABLE_SIGNALS_TOTAL,
    QUOTA_EXHAUSTED,
    PROVIDER_WINDOW_REPORTS_TOTAL,
    POOL_PICKS_TOTAL,
    POOL_MOVES_TOTAL,
    LIVE_VERSION,
    REFUSED_EARLY_TOTAL,
    EXPECTED_WAIT_SECONDS,
];

/// Permits released after their lease had ended: for a while the fleet could admit one more
/// than the limit (a call longer than its fixed TTL, or a watchdog that could not renew).
pub const RELEASED_AFTER_LEASE_TOTAL: &str = "wavegate_released_after_lease_total";
/// What is left of a rate budget, by `budget` (`requests`, `tokens`, `input`, `output`,
/// `requests_per_day`, `tokens_per_day`). In shared mode this and
/// the two gauges below are read from Redis by one process of the fleet at a time (the gauge
/// reader, chosen by the heartbeats), so their cost does not grow with the fleet; the other
/// processes export NaN, which `min`/`max` by upstream skip: aggregate with them.
pub const BUDGET_REMAINING: &str = "wavegate_budget_remaining";
/// Seconds until a spent rate budget has room for one more unit, by `budget`.
pub const BUDGET_NEXT_REFILL_SECONDS: &str = "wavegate_budget_next_refill_seconds";
/// Times the head of the queue waited for a rate budget, by `budget`.
pub const BUDGET_WAITS_TOTAL: &str = "wavegate_budget_waits_total";
/// The limit the provider announced, as a budget per minute, by `budget` (`requests`,
/// `tokens`, `input`, `output`); 0 when none is kept. The budget in force is the tighter of it and the
/// configured one.
pub const LEARNED_LIMIT_PER_MINUTE: &str = "wavegate_learned_limit_per_minute";

/// Refusals (429, 529, 503 with `Retry-After`) by `kind`: `capacity`, `rate_window`,
/// `quota_exhausted`, `overloaded`, `unknown`.
pub const REFUSALS_BY_KIND_TOTAL: &str = "wavegate_refusals_by_kind_total";
/// Rate-limit signals a provider sent that could not be read, by `kind` (`retry_after`,
/// `requests_remaining`, `tokens_reset`, `ratelimit`, ...).
pub const UNREADABLE_SIGNALS_TOTAL: &str = "wavegate_unreadable_signals_total";
/// 1 while a spent quota keeps the upstream refused in this process, else 0.
pub const QUOTA_EXHAUSTED: &str = "wavegate_quota_exhausted";
/// Reports of the provider's windows ("R left until T") sent to the gate in charge.
pub const PROVIDER_WINDOW_REPORTS_TOTAL: &str = "wavegate_provider_window_reports_total";

/// Pooled requests sent to a member, by `pool` and `member`.
pub const POOL_PICKS_TOTAL: &str = "wavegate_pool_picks_total";
/// Pooled requests that left a member for another, by `pool`, `member` and `reason` (the
/// outcome's label or the refusal's code).
pub const POOL_MOVES_TOTAL: &str = "wavegate_pool_moves_total";

/// Attempts let through at once in shadow mode (see `UpstreamConfigBuilder::shadow`).
pub const SHADOW_CALLS_TOTAL: &str = "wavegate_shadow_calls_total";
/// How long an attempt in shadow would have waited for its permit, seconds (histogram): its
/// ghost's wait.
pub const SHADOW_WAIT_SECONDS: &str = "wavegate_shadow_wait_seconds";
/// Attempts in shadow that would have been refused, by `reason` (the refusal's code:
/// `waited_too_long`, `queue_full`, `breaker_open`, `quota_exhausted`, ...).
pub const SHADOW_REFUSALS_TOTAL: &str = "wavegate_shadow_refusals_total";

/// Bucket bounds, seconds, for each histogram: waits from a millisecond to minutes, calls
/// from ten milliseconds to ten minutes.
pub const HISTOGRAM_BUCKETS: &[(&str, &[f64])] = &[
    (PERMIT_WAIT_SECONDS, WAIT_BUCKETS),
    (QUEUE_WAIT_SECONDS, WAIT_BUCKETS),
    (UPSTREAM_CALL_SECONDS, CALL_BUCKETS),
    (CLASS_PERMIT_WAIT_SECONDS, WAIT_BUCKETS),
    (SHADOW_WAIT_SECONDS, WAIT_BUCKETS),
];
const WAIT_BUCKETS: &[f64] = &[0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0];
const CALL_BUCKETS: &[f64] = &[0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0];

const STATES: [WaveState; 4] = [WaveState::Normal, WaveState::Cooldown, WaveState::Probe, WaveState::Degraded];
const MODES: [Mode; 3] = [Mode::Local, Mode::Shared, Mode::Fallback];
const BREAKER_STATES: [&str; 3] = ["closed", "open", "half_open"];

pub(crate) fn permits_in_flight(upstream: &str, scope: &'static str, value: usize) {
    gauge!(PERMITS_IN_FLIGHT, "upstream" => upstream.to_owned(), "scope" => scope).set(value as f64);
}

pub(crate) fn permit_granted(upstream: &str, queue_wait: Duration, permit_wait: Duration) {
    histogram!(QUEUE_WAIT_SECONDS, "upstream" => upstream.to_owned()).record(queue_wait.as_secs_f64());
    histogram!(PERMIT_WAIT_SECONDS, "upstream" => upstream.to_owned()).record(permit_wait.as_secs_f64());
}

/// A permit handed to this process by a release (the hand-off).
pub(crate) fn permit_handed(upstream: &str) {
    counter!(PERMITS_HANDED_TOTAL, "upstream" => upstream.to_owned()).increment(1);
}

/// An attempt let through in shadow.
pub(crate) fn shadow_call(upstream: &str) {
    counter!(SHADOW_CALLS_TOTAL, "upstream" => upstream.to_owned()).increment(1);
}

/// An attempt in shadow would have waited `wait`.
pub(crate) fn shadow_wait(upstream: &str, wait: Duration) {
    histogram!(SHADOW_WAIT_SECONDS, "upstream" => upstream.to_owned()).record(wait.as_secs_f64());
}

/// An attempt in shadow would have been refused with `code`.
pub(crate) fn shadow_refused(upstream: &str, code: &'static str) {
    counter!(SHADOW_REFUSALS_TOTAL, "upstream" => upstream.to_owned(), "reason" => code).increment(1);
}

/// A permit of priority class `class` granted after `wait` (queue and permit wait).
pub(crate) fn class_granted(upstream: &str, class: &str, wait: Duration) {
    counter!(CLASS_GRANTS_TOTAL, "upstream" => upstream.to_owned(), "class" => class.to_owned()).increment(1);
    histogram!(CLASS_PERMIT_WAIT_SECONDS, "upstream" => upstream.to_owned(), "class" => class.to_owned())
        .record(wait.as_secs_f64());
}

/// This process's callers waiting and permits held in class `class`.
pub(crate) fn class_load(upstream: &str, class: &str, waiting: usize, in_flight: usize) {
    gauge!(CLASS_WAITING, "upstream" => upstream.to_owned(), "class" => class.to_owned()).set(waiting as f64);
    gauge!(CLASS_IN_FLIGHT, "upstream" => upstream.to_owned(), "class" => class.to_owned()).set(in_flight as f64);
}

pub(crate) fn queue_depth(upstream: &str, depth: usize) {
    gauge!(QUEUE_DEPTH, "upstream" => upstream.to_owned()).set(depth as f64);
}

pub(crate) fn upstream_call(upstream: &str, outcome: &'static str, took: Duration) {
    histogram!(UPSTREAM_CALL_SECONDS, "upstream" => upstream.to_owned(), "outcome" => outcome)
        .record(took.as_secs_f64());
}

pub(crate) fn wave(upstream: &str, state: WaveState, limit: u32, wave: u64) {
    gauge!(LIMIT, "upstream" => upstream.to_owned()).set(f64::from(limit));
    gauge!(WAVE, "upstream" => upstream.to_owned()).set(wave as f64);
    for candidate in STATES {
        let value = if candidate == state { 1.0 } else { 0.0 };
        gauge!(WAVE_STATE, "upstream" => upstream.to_owned(), "state" => candidate.as_str()).set(value);
    }
}

pub(crate) fn rate_limited(upstream: &str, cut: Option<bool>) {
    counter!(RATE_LIMITED_TOTAL, "upstream" => upstream.to_owned()).increment(1);
    match cut {
        Some(true) => counter!(LIMIT_CUTS_TOTAL, "upstream" => upstream.to_owned()).increment(1),
        Some(false) => counter!(LATE_RATE_LIMITS_IGNORED_TOTAL, "upstream" => upstream.to_owned()).increment(1),
        None => {}
    }
}

pub(crate) fn breaker(upstream: &str, from: Option<&'static str>, to: &'static str) {
    if let Some(from) = from {
        counter!(BREAKER_TRANSITIONS_TOTAL, "upstream" => upstream.to_owned(), "from" => from, "to" => to).increment(1);
    }
    for candidate in BREAKER_STATES {
        let value = if candidate == to { 1.0 } else { 0.0 };
        gauge!(BREAKER_STATE, "upstream" => upstream.to_owned(), "state" => candidate).set(value);
    }
}

pub(crate) fn retry(upstream: &str, reason: &'static str) {
    counter!(RETRIES_TOTAL, "upstream" => upstream.to_owned(), "reason" => reason).increment(1);
}

pub(crate) fn retry_budget_refused(upstream: &str) {
    counter!(RETRY_BUDGET_REFUSALS_TOTAL, "upstream" => upstream.to_owned()).increment(1);
}

pub(crate) fn refused_early(upstream: &str, reason: &'static str) {
    counter!(REFUSED_EARLY_TOTAL, "upstream" => upstream.to_owned(), "reason" => reason).increment(1);
}

pub(crate) fn expected_wait(upstream: &str, class: &str, seconds: f64) {
    gauge!(EXPECTED_WAIT_SECONDS, "upstream" => upstream.to_owned(), "class" => class.to_owned()).set(seconds);
}

pub(crate) fn overload_refused(upstream: &str, reason: &'static str) {
    counter!(OVERLOAD_REFUSALS_TOTAL, "upstream" => upstream.to_owned(), "reason" => reason).increment(1);
}

/// The process's mode (the least shared of its upstreams').
pub(crate) fn mode(to: Mode) {
    for candidate in MODES {
        gauge!(MODE, "mode" => candidate.as_str()).set(if candidate == to { 1.0 } else { 0.0 });
    }
}

/// One upstream's mode, and its change from `from`.
pub(crate) fn upstream_mode(upstream: &str, from: Option<Mode>, to: Mode) {
    if let Some(from) = from {
        counter!(MODE_CHANGES_TOTAL, "upstream" => upstream.to_owned(), "from" => from.as_str(), "to" => to.as_str())
            .increment(1);
    }
    for candidate in MODES {
        gauge!(MODE, "upstream" => upstream.to_owned(), "mode" => candidate.as_str()).set(if candidate == to {
            1.0
        } else {
            0.0
        });
    }
}

pub(crate) fn redis_error(command: &'static str, kind: &'static str) {
    counter!(REDIS_ERRORS_TOTAL, "command" => command, "kind" => kind).increment(1);
}

pub(crate) fn reconciled(upstream: &str, adopted: usize, dropped: usize, granted_during_outage: u64) {
    counter!(RECONCILED_PERMITS_TOTAL, "upstream" => upstream.to_owned(), "action" => "adopted")
        .increment(adopted as u64);
    counter!(RECONCILED_PERMITS_TOTAL, "upstream" => upstream.to_owned(), "action" => "dropped")
        .increment(dropped as u64);
    counter!(OUTAGE_GRANTS_TOTAL, "upstream" => upstream.to_owned()).increment(granted_during_outage);
}

pub(crate) fn budgets(upstream: &str, status: BudgetStatus) {
    let each = [
        ("requests", status.requests),
        ("tokens", status.tokens),
        ("input", status.input),
        ("output", status.output),
        ("requests_per_day", status.requests_per_day),
        ("tokens_per_day", status.tokens_per_day),
    ];
    for (budget, value) in each {
        if let Some((remaining, next_refill_ms)) = value {
            gauge!(BUDGET_REMAINING, "upstream" => upstream.to_owned(), "budget" => budget).set(remaining as f64);
            gauge!(BUDGET_NEXT_REFILL_SECONDS, "upstream" => upstream.to_owned(), "budget" => budget)
                .set(next_refill_ms as f64 / 1000.0);
        }
    }
}

pub(crate) fn learned(upstream: &str, learned: wavegate_core::LearnedStatus) {
    for (budget, value) in learned.named() {
        let per_minute = value.map_or(0.0, |l| f64::from(l.limit.budget().per_minute()));
        gauge!(LEARNED_LIMIT_PER_MINUTE, "upstream" => upstream.to_owned(), "budget" => budget).set(per_minute);
    }
}

/// In shared mode, a process that is not the fleet's gauge reader: its budget and learned-limit
/// gauges say "not read here" (NaN, which Prometheus's `min` and `max` skip) rather than keep a
/// value it read earlier (as the reader, or in a fallback), which would go stale.
pub(crate) fn budgets_read_elsewhere(upstream: &str) {
    for budget in ["requests", "tokens", "input", "output", "requests_per_day", "tokens_per_day"] {
        gauge!(BUDGET_REMAINING, "upstream" => upstream.to_owned(), "budget" => budget).set(f64::NAN);
        gauge!(BUDGET_NEXT_REFILL_SECONDS, "upstream" => upstream.to_owned(), "budget" => budget).set(f64::NAN);
    }
    for (budget, _) in wavegate_core::LearnedStatus::default().named() {
        gauge!(LEARNED_LIMIT_PER_MINUTE, "upstream" => upstream.to_owned(), "budget" => budget).set(f64::NAN);
    }
}

pub(crate) fn budget_wait(upstream: &str, budget: &'static str) {
    counter!(BUDGET_WAITS_TOTAL, "upstream" => upstream.to_owned(), "budget" => budget).increment(1);
}

pub(crate) fn refusal(upstream: &str, kind: &'static str) {
    counter!(REFUSALS_BY_KIND_TOTAL, "upstream" => upstream.to_owned(), "kind" => kind).increment(1);
}

pub(crate) fn unreadable_signal(upstream: &str, kind: &'static str) {
    counter!(UNREADABLE_SIGNALS_TOTAL, "upstream" => upstream.to_owned(), "kind" => kind).increment(1);
}

pub(crate) fn quota_exhausted(upstream: &str, exhausted: bool) {
    gauge!(QUOTA_EXHAUSTED, "upstream" => upstream.to_owned()).set(if exhausted { 1.0 } else { 0.0 });
}

pub(crate) fn live_version(upstream: &str, version: u64) {
    gauge!(LIVE_VERSION, "upstream" => upstream.to_owned()).set(version as f64);
}

pub(crate) fn provider_window_report(upstream: &str) {
    counter!(PROVIDER_WINDOW_REPORTS_TOTAL, "upstream" => upstream.to_owned()).increment(1);
}

pub(crate) fn pool_pick(pool: &str, member: &str) {
    counter!(POOL_PICKS_TOTAL, "pool" => pool.to_owned(), "member" => member.to_owned()).increment(1);
}

pub(crate) fn pool_move(pool: &str, member: &str, reason: &'static str) {
    counter!(POOL_MOVES_TOTAL, "pool" => pool.to_owned(), "member" => member.to_owned(), "reason" => reason)
        .increment(1);
}

pub(crate) fn released_after_lease(upstream: &str) {
    counter!(RELEASED_AFTER_LEASE_TOTAL, "upstream" => upstream.to_owned()).increment(1);
}
