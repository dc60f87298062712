//! Failure domains: the upstreams that fall back, are probed, reconciled and shared again
//! together.
//!
//! On a single Redis (or the primary behind Sentinel) every upstream's keys live on one server:
//! one domain holds them all, so an outage switches every upstream at once and one probe (a
//! `PING` and a heartbeat) per backoff asks whether the server is back. On a Cluster each
//! upstream's keys live on the master that serves its hash tag's slot (which a resharding may
//! move): each upstream is a domain of its own, so losing one master puts only the upstreams it
//! serves in fallback, and each of them is probed by a command routed by its own key.

use std::time::Duration;

use crate::status::Mode;

/// The first probe after a switch comes this soon; each failed one doubles the wait (see
/// `modes.rs`).
pub(super) const PROBE_MIN: Duration = Duration::from_millis(100);

/// One failure domain's mode and the book-keeping of its switches.
#[derive(Debug)]
pub(super) struct Domain {
    /// Where its upstreams' permits come from now.
    pub(super) mode: Mode,
    /// Bumped at every change of its mode: replies to calls made before it are stale.
    pub(super) epoch: u64,
    /// A reconciliation of its upstreams is in flight (their lanes hold their waiters and defer
    /// their releases meanwhile).
    pub(super) reconciling: bool,
    /// The wait before its next probe.
    pub(super) probe_backoff: Duration,
    /// Its upstreams (indexes into the coordinator's slots).
    pub(super) upstreams: Vec<usize>,
}

impl Domain {
    fn new(mode: Mode, upstreams: Vec<usize>) -> Self {
        Self { mode, epoch: 0, reconciling: false, probe_backoff: PROBE_MIN, upstreams }
    }
}

/// The domains of `upstreams` upstreams: one per upstream on a Cluster, otherwise one for all.
/// Returns them and each upstream's domain.
pub(super) fn split(upstreams: usize, cluster: bool, mode: Mode) -> (Vec<Domain>, Vec<usize>) {
    if cluster {
        let domains = (0..upstreams).map(|u| Domain::new(mode, vec![u])).collect();
        (domains, (0..upstreams).collect())
    } else {
        (vec![Domain::new(mode, (0..upstreams).collect())], vec![0; upstreams])
    }
}

/// The process's mode as its heartbeat tells the fleet (`wavegate status`): `shared`, or the
/// least shared mode with how many of the upstreams are not shared, e.g. `fallback 2/100`
/// (`rejected` for a fallback the store's rejection caused).
pub(super) fn told(domains: &[Domain], rejected: bool) -> String {
    let mode = match least_shared(domains) {
        Mode::Fallback if rejected => Mode::Rejected,
        mode => mode,
    };
    let total: usize = domains.iter().map(|d| d.upstreams.len()).sum();
    let off: usize = domains.iter().filter(|d| d.mode != Mode::Shared).map(|d| d.upstreams.len()).sum();
    if off == 0 { mode.as_str().to_owned() } else { format!("{mode} {off}/{total}") }
}

/// The process's mode when its domains' modes may differ: the least shared of them. Shared (or
/// local) only when every domain is; fallback as soon as one is.
pub(super) fn least_shared(domains: &[Domain]) -> Mode {
    let rank = |mode: Mode| match mode {
        Mode::Local => 0,
        Mode::Shared => 1,
        Mode::Fallback => 2,
        Mode::Rejected => 3,
    };
    domains.iter().map(|d| d.mode).max_by_key(|m| rank(*m)).unwrap_or(Mode::Local)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_server_is_one_domain_and_a_cluster_one_per_upstream() {
        let (domains, of) = split(3, false, Mode::Shared);
        assert_eq!((domains.len(), of), (1, vec![0, 0, 0]));
        assert_eq!(domains[0].upstreams, vec![0, 1, 2]);
        let (domains, of) = split(3, true, Mode::Shared);
        assert_eq!((domains.len(), of), (3, vec![0, 1, 2]));
        assert!(domains.iter().enumerate().all(|(i, d)| d.upstreams == vec![i]));
    }

    #[test]
    fn the_process_reports_its_least_shared_mode() {
        let (mut domains, _) = split(3, true, Mode::Shared);
        assert_eq!(least_shared(&domains), Mode::Shared);
        domains[1].mode = Mode::Fallback;
        assert_eq!(least_shared(&domains), Mode::Fallback);
        domains[2].mode = Mode::Rejected;
        assert_eq!(least_shared(&domains), Mode::Rejected);
        assert_eq!(least_shared(&split(2, false, Mode::Local).0), Mode::Local);
    }
}
