//! The strategies compared, as data: add one here and every scenario runs it.

use std::time::Duration;

use wavegate::UpstreamConfig;
use wavegate::config::{self, UpstreamConfigBuilder};

/// One way of sending the job list to the provider.
#[derive(Debug)]
pub(crate) struct Strategy {
    /// Its name in tables, pictures and on the command line.
    pub(crate) name: &'static str,
    /// One line on what it does.
    pub(crate) summary: &'static str,
    pub(crate) kind: Kind,
    /// Run once for reference only, not in every round of `--repeat` (it is slow by design).
    pub(crate) reference: bool,
}

/// How a strategy works.
#[derive(Debug)]
pub(crate) enum Kind {
    /// Per-request retries with exponential backoff and full jitter, no coordination at all
    /// (tenacity's `wait_random_exponential` + `stop_after_attempt`): the wait before retry
    /// `n` (1-based) is uniform in `[0, min(cap, base × 2^(n-1))]`.
    Naive { attempts: u32, base: Duration, cap: Duration },
    /// A `tokio::sync::Semaphore` of `per_process` permits in each process, held only during
    /// the call; a failed call is retried after `backoffs[i]` × a jitter factor uniform in
    /// [0.5, 1.5], so `backoffs.len() + 1` attempts in all.
    Semaphore { per_process: usize, backoffs: &'static [Duration] },
    /// `wavegate::RequestBuilder::call` in shared mode (one Redis for the fleet).
    Wavegate { recovery: Recovery },
    /// Knows the truth, no Redis: each process takes its static share of the provider's
    /// capacity (and of its rate window), follows the capacity the provider announces in
    /// `X-Capacity` on every answer, and retries a rare 429 at once through its limiter.
    Oracle,
}

impl Kind {
    /// Whether the strategy needs a Redis.
    pub(crate) fn uses_redis(&self) -> bool {
        matches!(self, Kind::Wavegate { .. })
    }
}

/// Which recovery after a 429 wave the scheduler runs, pinned explicitly (never "the
/// library's default", so a change of default cannot silently change a row).
///
/// To compare another recovery: add a variant here, map it to the library's option in
/// [`configure`], and add a `Strategy` entry to [`STRATEGIES`]. Nothing else changes: the
/// runner, the tables, the pictures and the end-to-end test take the list as it is. A
/// strategy that cannot run yet goes to [`PENDING`], which the runner prints as "NOT RUN".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Recovery {
    /// The seed's recovery as DESIGN.md walks it: PROBE at 1, then 2 → 4 → 8 → … → the
    /// configured limit (`wavegate::config::Recovery::Seed`).
    Seed,
    /// The library's default (`wavegate::config::Recovery::Adaptive`): a 429 above the last
    /// limit that held steps the limit back without stopping the fleet; a 429 at what held,
    /// a burst or one in PROBE stops it; re-tests spaced in time and backed off.
    Adaptive,
}

/// The upstream configuration every wavegate worker uses, with the given recovery.
pub(crate) fn configure(recovery: Recovery, limit: u32, lease: Duration) -> UpstreamConfigBuilder {
    configure_named(crate::worker::UPSTREAM, recovery, limit, lease)
}

/// [`configure`] for an upstream of another name (a pool's member).
pub(crate) fn configure_named(name: &str, recovery: Recovery, limit: u32, lease: Duration) -> UpstreamConfigBuilder {
    let builder = UpstreamConfig::builder(name)
        .limit(limit)
        .renewed_lease(lease)
        .call_timeout(Duration::from_secs(10))
        .max_wait(Duration::from_secs(300))
        .total_timeout(Duration::from_secs(600));
    match recovery {
        Recovery::Seed => builder.recovery(config::Recovery::Seed),
        Recovery::Adaptive => builder.recovery(config::Recovery::Adaptive),
    }
}

/// Every strategy that runs, in table order.
pub(crate) const STRATEGIES: &[Strategy] = &[
    Strategy {
        name: "naive",
        summary: "per-request retries, exponential backoff with full jitter (0.5 s base, 8 s cap), 6 attempts, \
                  no coordination",
        kind: Kind::Naive { attempts: 6, base: Duration::from_millis(500), cap: Duration::from_secs(8) },
        reference: false,
    },
    Strategy {
        name: "semaphore",
        summary: "6 permits per process, 3 retries after 0.5 / 1 / 2 s × jitter [0.5, 1.5] (4 attempts)",
        kind: Kind::Semaphore {
            per_process: 6,
            backoffs: &[Duration::from_millis(500), Duration::from_secs(1), Duration::from_secs(2)],
        },
        reference: false,
    },
    Strategy {
        name: "wavegate-seed",
        summary: "wavegate, shared mode, the seed's recovery as DESIGN.md walks it (PROBE 1 → 2 → 4 → 8 → limit)",
        kind: Kind::Wavegate { recovery: Recovery::Seed },
        reference: true,
    },
    Strategy {
        name: "oracle",
        summary: "knows the capacity (and the rate window) and follows it, a static share per process, no Redis: \
                  the floor",
        kind: Kind::Oracle,
        reference: false,
    },
    Strategy {
        name: "wavegate-adaptive",
        summary: "wavegate, shared mode, the default recovery (Recovery::Adaptive: a 429 above what held steps \
                  back without stopping the fleet, re-tests spaced in time)",
        kind: Kind::Wavegate { recovery: Recovery::Adaptive },
        reference: false,
    },
];

/// A strategy that is planned but cannot run yet, and what it waits for.
#[derive(Debug)]
pub(crate) struct Pending {
    pub(crate) name: &'static str,
    pub(crate) waits_for: &'static str,
}

/// Strategies named in the plan that the library cannot run yet (see [`Recovery`]): none now.
pub(crate) const PENDING: &[Pending] = &[];

/// The strategy called `name`.
pub(crate) fn find(name: &str) -> Option<&'static Strategy> {
    STRATEGIES.iter().find(|s| s.name == name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_every_wavegate_configuration_builds() {
        for (i, s) in STRATEGIES.iter().enumerate() {
            assert!(STRATEGIES[..i].iter().all(|o| o.name != s.name), "{} twice", s.name);
            assert!(PENDING.iter().all(|p| p.name != s.name), "{} is both pending and running", s.name);
            if let Kind::Wavegate { recovery } = s.kind {
                configure(recovery, 10, Duration::from_secs(5)).build().expect("a valid configuration");
            }
        }
        assert!(find("naive").is_some() && find("nope").is_none());
    }
}
