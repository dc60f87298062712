//! The fleet as its store holds it: the upstreams that claimed a configuration, each one's
//! shared state (through the status script, as the processes read it), its provider windows,
//! and the live processes.

use std::time::Duration;

use wavegate_core::{BudgetStatus, LearnedStatus, LiveChange, LiveSetting, LiveSettings, UpstreamName, WaveState};
use wavegate_redis::{LiveProcess, SharedGate, Store, StoreError, live_processes};

/// One provider window as the fleet keeps it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct WindowView {
    /// What is left.
    pub(crate) left: u64,
    /// How long it still runs.
    pub(crate) ends_in: Duration,
}

/// One priority class, fleet-wide.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ClassView {
    pub(crate) name: String,
    pub(crate) in_flight: u32,
    pub(crate) waiting: u32,
}

/// One upstream, fleet-wide.
#[derive(Debug, Clone)]
pub(crate) struct UpstreamView {
    pub(crate) name: String,
    pub(crate) state: WaveState,
    pub(crate) limit: u32,
    pub(crate) configured_limit: u32,
    pub(crate) wave: u64,
    pub(crate) cooldown_remaining: Duration,
    pub(crate) in_flight: u32,
    pub(crate) classes: Vec<ClassView>,
    pub(crate) budgets: BudgetStatus,
    pub(crate) learned: LearnedStatus,
    /// The requests and tokens windows, when one runs.
    pub(crate) windows: [Option<WindowView>; 2],
    /// The fallback limit configured, if any.
    pub(crate) fallback_limit: Option<u32>,
    /// The live settings an operator set, with their version.
    pub(crate) live: LiveSettings,
}

/// The whole fleet.
#[derive(Debug, Clone)]
pub(crate) struct FleetView {
    pub(crate) prefix: String,
    /// Live processes: their instance, how long their last heartbeat still counts, their mode.
    pub(crate) processes: Vec<LiveProcess>,
    pub(crate) upstreams: Vec<UpstreamView>,
    /// Upstreams named but without a claim in the store (no live process configures them).
    pub(crate) unknown: Vec<String>,
    /// Upstreams whose claim this tool cannot read (a process of another version claimed
    /// them), with the number of settings in the claim.
    pub(crate) unreadable: Vec<(String, usize)>,
}

/// What reading the fleet can meet.
#[derive(Debug)]
pub(crate) enum ReadError {
    Store(StoreError),
    /// A name that is not an upstream name.
    BadName(String),
    /// An upstream no live process configures (no claim under the prefix).
    Unconfigured(String),
    /// A rate for a budget the upstream is not configured with.
    NoSuchBudget(String, String),
    /// A setting of a class the upstream does not have.
    NoSuchClass(String, String),
}

impl std::fmt::Display for ReadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReadError::Store(error) => write!(f, "{error}"),
            ReadError::BadName(name) => write!(f, "{name:?} is not an upstream name"),
            ReadError::NoSuchBudget(name, setting) => {
                write!(f, "{name:?} has no budget {setting} configured; a live change only changes a configured rate")
            }
            ReadError::NoSuchClass(name, class) => {
                write!(f, "{name:?} has no priority class {class:?}; nothing changed")
            }
            ReadError::Unconfigured(name) => write!(
                f,
                "no live process configures {name:?} under this prefix (see `wavegate status`); nothing changed"
            ),
        }
    }
}

impl From<StoreError> for ReadError {
    fn from(error: StoreError) -> Self {
        ReadError::Store(error)
    }
}

/// The store's clock, in ms.
async fn store_now_ms(store: &Store) -> Result<u64, StoreError> {
    let (secs, micros): (u64, u64) = store.query("TIME", redis::cmd("TIME")).await?;
    Ok(secs.saturating_mul(1_000) + micros / 1_000)
}

/// The upstream names of every configuration claimed under the prefix (`SCAN`; on a Cluster
/// one node's keys only: name the upstreams there).
async fn claimed_names(store: &Store) -> Result<Vec<String>, StoreError> {
    let prefix = store.config().keyspace.prefix().to_owned();
    let pattern = format!("{prefix}:{{*}}:config");
    let mut names = Vec::new();
    let mut cursor = 0u64;
    // Bounded: at most 10,000 rounds of a SCAN (each a few hundred keys).
    for _ in 0..10_000 {
        let mut cmd = redis::cmd("SCAN");
        cmd.arg(cursor).arg("MATCH").arg(&pattern).arg("COUNT").arg(500);
        let (next, keys): (u64, Vec<String>) = store.query("SCAN", cmd).await?;
        for key in keys {
            let name = key.strip_prefix(&format!("{prefix}:{{"));
            if let Some(name) = name.and_then(|rest| rest.strip_suffix("}:config")) {
                names.push(name.to_owned());
            }
        }
        cursor = next;
        if cursor == 0 {
            break;
        }
    }
    names.sort();
    names.dedup();
    Ok(names)
}

/// A window from the wave hash's fields, if it runs at `now`.
fn window(left: Option<u64>, until: Option<u64>, now: u64) -> Option<WindowView> {
    let until = until.filter(|until| *until > now)?;
    Some(WindowView { left: left.unwrap_or(0), ends_in: Duration::from_millis(until - now) })
}

/// The class names of a claim's classes field (`[*]name:weight:reserve[:budget]`, `,`-joined).
fn class_names(claim: &str) -> Vec<String> {
    let fields: Vec<&str> = claim.split('|').collect();
    let classes = fields.len().checked_sub(2).and_then(|at| fields.get(at)).copied().unwrap_or("");
    classes
        .split(',')
        .filter(|entry| !entry.is_empty() && !entry.starts_with('@'))
        .filter_map(|entry| entry.trim_start_matches('*').split(':').next())
        .map(str::to_owned)
        .collect()
}

/// One upstream, from its claim.
async fn upstream(
    store: &Store,
    name: &UpstreamName,
    claim: &str,
    now: u64,
) -> Result<Option<UpstreamView>, ReadError> {
    let Some(gate) = SharedGate::from_claim(store.clone(), name, claim) else { return Ok(None) };
    // The live limit is the base the processes send the status script, not the claimed one.
    let live = gate.live(None).await?.unwrap_or_default();
    gate.set_live(&live);
    let (status, classes) = gate.status_with_classes().await?;
    let keys = store.config().keyspace.upstream(name);
    let mut cmd = redis::cmd("HMGET");
    cmd.arg(&keys.wave).arg(&["pw_requests_left", "pw_requests_until", "pw_tokens_left", "pw_tokens_until"][..]);
    let fields: Vec<Option<u64>> = store.query("HMGET", cmd).await?;
    let field = |at: usize| fields.get(at).copied().flatten();
    let configured_limit = claim.split('|').next().and_then(|limit| limit.parse().ok()).unwrap_or(status.limit);
    let names = class_names(claim);
    Ok(Some(UpstreamView {
        name: name.as_str().to_owned(),
        state: status.state,
        limit: status.limit,
        configured_limit,
        wave: status.wave,
        cooldown_remaining: status.cooldown_remaining,
        in_flight: status.in_flight,
        classes: names
            .into_iter()
            .zip(classes)
            .map(|(name, (in_flight, waiting))| ClassView { name, in_flight, waiting })
            .collect(),
        budgets: status.budgets,
        learned: status.learned,
        windows: [window(field(0), field(1), now), window(field(2), field(3), now)],
        fallback_limit: claim.rsplit_once("fallback:").and_then(|(_, n)| n.parse().ok()),
        live,
    }))
}

/// Reads the fleet: `names` (every claimed upstream when empty).
pub(crate) async fn read(store: &Store, names: &[String]) -> Result<FleetView, ReadError> {
    let now = store_now_ms(store).await?;
    let names = if names.is_empty() { claimed_names(store).await? } else { names.to_vec() };
    let mut view = FleetView {
        prefix: store.config().keyspace.prefix().to_owned(),
        processes: Vec::new(),
        upstreams: Vec::new(),
        unknown: Vec::new(),
        unreadable: Vec::new(),
    };
    for name in names {
        let upstream_name = UpstreamName::new(&name).map_err(|_| ReadError::BadName(name.clone()))?;
        let key = store.config().keyspace.upstream(&upstream_name).config;
        let claim: Option<String> = store.query("GET", redis::cmd("GET").arg(key).clone()).await?;
        match claim {
            Some(claim) => match upstream(store, &upstream_name, &claim, now).await? {
                Some(upstream) => view.upstreams.push(upstream),
                None => view.unreadable.push((name, claim.split('|').count())),
            },
            None => view.unknown.push(name),
        }
    }
    view.processes = live_processes(store, now).await?;
    Ok(view)
}

/// Forgets `name`'s provider windows for the fleet (logged by nobody: the tool says it).
pub(crate) async fn clear_window(store: &Store, name: &str) -> Result<(), ReadError> {
    let upstream = UpstreamName::new(name).map_err(|_| ReadError::BadName(name.to_owned()))?;
    let gate = SharedGate::new(store.clone(), &upstream, &wavegate_core::WaveConfig::new(std::num::NonZeroU32::MIN));
    gate.clear_windows().await?;
    Ok(())
}

/// What `set` did: the version, and the settings as they stand after it.
#[derive(Debug, Clone)]
pub(crate) struct SetView {
    pub(crate) version: u64,
    pub(crate) live: LiveSettings,
}

/// Stores `change` of `name`'s live settings for the fleet (refused for an upstream no live
/// process configures: most likely a typo).
pub(crate) async fn set(store: &Store, name: &str, change: &LiveChange) -> Result<SetView, ReadError> {
    let upstream = UpstreamName::new(name).map_err(|_| ReadError::BadName(name.to_owned()))?;
    let key = store.config().keyspace.upstream(&upstream).config;
    let claim: Option<String> = store.query("GET", redis::cmd("GET").arg(key).clone()).await?;
    let Some(claim) = claim else { return Err(ReadError::Unconfigured(name.to_owned())) };
    // A rate only for a budget the fleet is configured with (the claim's rates: a minute).
    let field = match change {
        LiveChange::Set { setting: LiveSetting::RequestsPerMinute | LiveSetting::RequestsBurst, .. } => Some(5),
        LiveChange::Set { setting: LiveSetting::TokensPerMinute | LiveSetting::TokensBurst, .. } => Some(7),
        _ => None,
    };
    if field.is_some_and(|field| claim.split('|').nth(field).is_none_or(|rate| rate == "0")) {
        return Err(ReadError::NoSuchBudget(name.to_owned(), change.name()));
    }
    // A class's setting only for a class the fleet has (the claim's classes).
    if let LiveChange::SetClass { class, .. } | LiveChange::ClearClass { class, .. } = change
        && !class_names(&claim).contains(class)
    {
        return Err(ReadError::NoSuchClass(name.to_owned(), class.clone()));
    }
    let gate = SharedGate::new(store.clone(), &upstream, &wavegate_core::WaveConfig::new(std::num::NonZeroU32::MIN));
    let version = gate.change_live(change).await?;
    let live = gate.live(None).await?.unwrap_or_default();
    Ok(SetView { version, live })
}

/// Lifts every process's refusal of `name` for a spent quota (a new mark in its live
/// settings, the store's time) and forgets its provider windows; answers the live settings'
/// version.
pub(crate) async fn reset_quota(store: &Store, name: &str) -> Result<u64, ReadError> {
    let upstream = UpstreamName::new(name).map_err(|_| ReadError::BadName(name.to_owned()))?;
    let key = store.config().keyspace.upstream(&upstream).config;
    let claim: Option<String> = store.query("GET", redis::cmd("GET").arg(key).clone()).await?;
    if claim.is_none() {
        return Err(ReadError::Unconfigured(name.to_owned()));
    }
    let gate = SharedGate::new(store.clone(), &upstream, &wavegate_core::WaveConfig::new(std::num::NonZeroU32::MIN));
    gate.clear_windows().await?;
    Ok(gate.reset_quota_fleet(store_now_ms(store).await?).await?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_class_names_of_a_claim() {
        let claim = "10|3|5000|1000|60000|0|0|0|0|adaptive|1000|60000|4|*interactive:3:20,batch:1:0:50|fallback:-";
        assert_eq!(class_names(claim), ["interactive", "batch"]);
        assert!(class_names("10|3|5000|1000|60000|0|0|0|0|seed|1000|60000|4||fallback:2").is_empty());
        assert!(class_names("garbage").is_empty());
    }

    #[test]
    fn a_window_that_ended_is_none() {
        assert_eq!(
            window(Some(3), Some(1_500), 1_000),
            Some(WindowView { left: 3, ends_in: Duration::from_millis(500) })
        );
        assert_eq!(window(Some(3), Some(900), 1_000), None);
        assert_eq!(window(None, None, 1_000), None);
    }
}
