//! What the scheduler can tell about an upstream right now.

use std::fmt;
use std::time::Duration;

use wavegate_core::{BudgetStatus, LearnedStatus, WaveState};

use crate::shadow::ShadowStatus;

/// Where permits come from. Serialized (feature `serde`) as [`as_str`](Mode::as_str) says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize), serde(rename_all = "lowercase"))]
#[non_exhaustive]
pub enum Mode {
    /// In-process only: no Redis configured (the embedded default).
    Local,
    /// Shared across the fleet through Redis.
    Shared,
    /// Redis is configured but unreachable: permits come from this process's fair share of
    /// the limit until the store is back and reconciled.
    Fallback,
    /// Redis is configured and answers but rejects wavegate (a wrong password, an ACL user
    /// without a right the scripts need, a server older than 6.2): permits come from the
    /// fallback share as in [`Fallback`](Mode::Fallback), an error is logged every 10 s, and
    /// `Scheduler::store_health` gives the server's words, until it accepts again.
    Rejected,
}

impl Mode {
    /// `local`, `shared`, `fallback` or `rejected`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Mode::Local => "local",
            Mode::Shared => "shared",
            Mode::Fallback => "fallback",
            Mode::Rejected => "rejected",
        }
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One upstream's state as this process sees it (from `Scheduler::statuses`).
///
/// With the `serde` feature it is `Serialize`: the names as here, the durations as serde writes
/// a `Duration` (`{"secs": .., "nanos": ..}`), the state as `NORMAL`, `COOLDOWN`, ..., the mode as
/// `local`, `shared`, ... (`wavegate-web`'s status body is a flatter view of it, in milliseconds).
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct UpstreamStatus {
    /// The upstream's name.
    pub upstream: String,
    /// Where permits come from.
    pub mode: Mode,
    /// The wave state.
    pub state: WaveState,
    /// The current limit.
    pub limit: u32,
    /// The current wave id.
    pub wave: u64,
    /// The rest of the cooldown (zero outside COOLDOWN).
    pub cooldown_remaining: Duration,
    /// Permits held by this process.
    pub in_flight_local: usize,
    /// Permits held across the fleet (`None` when the shared store could not be read).
    pub in_flight_fleet: Option<u32>,
    /// Callers of this process waiting for a permit.
    pub queue_depth: usize,
    /// The expected wait of a caller joining the queue now: an **estimate** (it never refuses
    /// anyone): what holds every grant back for a known time (a cooldown, a spent provider
    /// window, a budget's wait as the gate last said, a spent quota), plus the callers
    /// waiting times the mean interval between this process's recent grants (its last 32
    /// within a minute). `None` while callers wait and fewer than two grants came within the
    /// last minute.
    pub expected_wait: Option<Duration>,
    /// The circuit breaker's state: `closed`, `open` or `half_open`.
    pub breaker: &'static str,
    /// What is left of the requests and tokens budgets in force: the configured ones, tightened
    /// by the limits the provider announced (a learned limit alone is a budget too).
    pub budgets: BudgetStatus,
    /// The limits the provider announced with a known window, as kept (the fleet's in shared
    /// mode; this process's otherwise), and how long until each is forgotten.
    pub learned: LearnedStatus,
    /// How long a spent quota keeps the upstream refused in this process (`None`: it is not);
    /// see [`ErrorKind::QuotaExhausted`](crate::ErrorKind::QuotaExhausted).
    pub quota_exhausted_for: Option<Duration>,
    /// How many local-mode schedulers of this process name this upstream, this one included
    /// (0 for a scheduler in shared mode, which shares one limit through Redis). Those with the
    /// same key prefix and configuration share one limit (one in-process gate); the fleet
    /// counts (`in_flight_fleet`) are the gate's.
    pub schedulers_in_process: usize,
    /// The priority classes, in configured order (empty without classes).
    pub classes: Vec<ClassStatus>,
    /// The limit in NORMAL in force: the live one (see
    /// [`Upstream::set_limit`](crate::Upstream::set_limit)), else the configured one.
    pub base_limit: u32,
    /// The limit this process was configured with.
    pub configured_limit: u32,
    /// The version of the live settings this process applied (0: none was ever set).
    pub live_version: u64,
    /// Shadow mode: whether it is on, and what it recorded (see
    /// [`UpstreamConfigBuilder::shadow`](crate::config::UpstreamConfigBuilder::shadow)).
    pub shadow: ShadowStatus,
}

/// One priority class of an upstream, as this process sees it (`Serialize` with the `serde`
/// feature).
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct ClassStatus {
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
    /// The expected wait of a caller joining it now, as [`UpstreamStatus::expected_wait`]
    /// with this class's callers and grants: an estimate.
    pub expected_wait: Option<Duration>,
    /// Permits of it this process holds.
    pub in_flight_local: usize,
    /// Permits of it held across the fleet (shared mode, when the store could be read).
    pub in_flight_fleet: Option<u32>,
    /// Callers of it waiting across the fleet (shared mode: the processes that asked within
    /// the last 1.5 s).
    pub waiting_fleet: Option<u32>,
}
