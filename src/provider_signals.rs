//! What the provider said, made visible: refusals counted by kind, unreadable signals counted
//! and logged (rate-limited), a spent quota turned into a refusal of the upstream.
//!
//! Every reported outcome passes here ([`observe`]), whether the call ran inside
//! [`RequestBuilder::call`](crate::RequestBuilder::call) or the caller made it on a
//! [`Permit`](crate::Permit) of its own.

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use wavegate_core::{Outcome, RateLimitKind};

use crate::metrics;
use crate::quota::QuotaBlock;

/// At most one log line per upstream and kind of unreadable signal in this long; the next
/// says how many were not logged meanwhile. (The counter counts every one.)
const LOG_EVERY: Duration = Duration::from_secs(60);

/// Counts and logs what `outcome` says about `upstream`; a spent quota refuses the upstream
/// for `quota_pause` from now (see `quota.rs`).
pub(crate) fn observe(upstream: &str, outcome: &Outcome, quota: &QuotaBlock, quota_pause: Duration) {
    for kind in outcome.unreadable().iter() {
        metrics::unreadable_signal(upstream, kind.as_str());
        if let Some(unlogged) = log_due(upstream, kind.as_str()) {
            tracing::warn!(
                upstream,
                signal = kind.as_str(),
                unlogged,
                "the provider sent a rate-limit signal that cannot be read; it is ignored"
            );
        }
    }
    let Some(kind) = outcome.rate_limit_kind() else { return };
    metrics::refusal(upstream, kind.as_str());
    if kind == RateLimitKind::QuotaExhausted {
        let refused_for = quota.exhaust(quota_pause);
        metrics::quota_exhausted(upstream, true);
        tracing::warn!(
            upstream,
            refused_for_s = refused_for.as_secs(),
            "the provider says the quota is exhausted: calls are refused until then or an operator reset"
        );
    }
}

/// Whether a line for (`upstream`, `kind`) may be logged now, with how many were skipped.
fn log_due(upstream: &str, kind: &'static str) -> Option<u64> {
    /// (upstream, kind) → when a line was last logged, and how many were skipped since.
    type Logged = HashMap<(String, &'static str), (Instant, u64)>;
    static LAST: OnceLock<Mutex<Logged>> = OnceLock::new();
    let mut last = LAST.get_or_init(Mutex::default).lock().unwrap_or_else(PoisonError::into_inner);
    let now = Instant::now();
    match last.get_mut(&(upstream.to_string(), kind)) {
        Some((at, skipped)) if now.duration_since(*at) < LOG_EVERY => {
            *skipped += 1;
            None
        }
        Some((at, skipped)) => {
            let unlogged = *skipped;
            (*at, *skipped) = (now, 0);
            Some(unlogged)
        }
        None => {
            last.insert((upstream.to_string(), kind), (now, 0));
            Some(0)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_per_upstream_and_kind_per_period() {
        assert_eq!(log_due("log-test", "retry_after"), Some(0));
        assert_eq!(log_due("log-test", "retry_after"), None);
        assert_eq!(log_due("log-test", "retry_after"), None);
        assert_eq!(log_due("log-test", "requests_reset"), Some(0), "another kind has its own period");
        assert_eq!(log_due("log-test-2", "retry_after"), Some(0), "another upstream too");
    }
}
