//! Live settings: what an operator changes while the fleet runs, over the configuration each
//! process was built with.
//!
//! A change is stored with a version — in the shared store for the fleet (`lua/live.lua`), or
//! on a [`LiveBoard`] in local mode — and every process compares the version it applied with
//! the stored one about once a second; a new version is read and applied whole. A value set
//! with a time to live (an override) reverts to each process's configured value when it runs
//! out: the store (or the board) drops it at the first look after its end and bumps the
//! version, so a process started after the change sees the same thing as one that saw it
//! made. The version counts within an epoch ([`LiveStamp`]), new when the store lost the
//! settings and started over.
//!
//! ```
//! use std::num::NonZeroU32;
//! use std::time::Duration;
//! use wavegate_core::{LiveBoard, LiveChange, LiveSetting};
//!
//! let mut board = LiveBoard::default();
//! let change = LiveChange::set(LiveSetting::Limit, 4, Some(Duration::from_secs(60)))?;
//! assert_eq!(board.apply(&change, 0), 1);
//! let configured = NonZeroU32::new(10).unwrap();
//! assert_eq!(board.read(30_000).limit_or(configured).get(), 4);
//! // The override ran out: back to the configured limit, under a new version.
//! let after = board.read(60_000);
//! assert_eq!((after.version, after.limit_or(configured).get()), (2, 10));
//! # Ok::<(), wavegate_core::LiveError>(())
//! ```

use std::collections::{BTreeMap, HashMap};
use std::num::NonZeroU32;
use std::time::Duration;

use crate::clock::duration_ms;
use crate::config::{UpstreamConfig, UpstreamName};
use crate::gcra::RateBudget;
use crate::pool::PoolConfig;
use crate::priority::PriorityClass;
use crate::shadow::ShadowScope;

/// A setting that can be changed live.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum LiveSetting {
    /// The concurrency limit in NORMAL (the configured [`limit`](crate::UpstreamConfig::limit)).
    Limit,
    /// The rate of the requests budget, a minute (its burst stays as configured); only for an
    /// upstream configured with one.
    RequestsPerMinute,
    /// The rate of the tokens budget, a minute (its burst stays as configured); only for an
    /// upstream configured with one.
    TokensPerMinute,
    /// The burst of the requests budget (its rate stays as set); only for an upstream
    /// configured with one.
    RequestsBurst,
    /// The burst of the tokens budget (its rate stays as set); only for an upstream configured
    /// with one.
    TokensBurst,
    /// Shadow mode for the whole upstream: 1 on, 0 off (see
    /// [`ShadowScope`](crate::ShadowScope)).
    Shadow,
}

impl LiveSetting {
    /// Every live setting.
    pub const ALL: [LiveSetting; 6] = [
        LiveSetting::Limit,
        LiveSetting::RequestsPerMinute,
        LiveSetting::TokensPerMinute,
        LiveSetting::RequestsBurst,
        LiveSetting::TokensBurst,
        LiveSetting::Shadow,
    ];

    /// Its name in the store and on the command line.
    pub const fn as_str(self) -> &'static str {
        match self {
            LiveSetting::Limit => "limit",
            LiveSetting::RequestsPerMinute => "requests_per_minute",
            LiveSetting::TokensPerMinute => "tokens_per_minute",
            LiveSetting::RequestsBurst => "requests_burst",
            LiveSetting::TokensBurst => "tokens_burst",
            LiveSetting::Shadow => "shadow",
        }
    }

    /// The values it may take.
    const fn range(self) -> (u64, u64) {
        match self {
            LiveSetting::Shadow => (0, 1),
            _ => (1, u32::MAX as u64),
        }
    }

    /// The setting named `name`, if it is one.
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|setting| setting.as_str() == name)
    }
}

/// A live value as it stands: the value, and what is left of its time to live (`None`: it
/// stays until changed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LiveValue {
    /// The value.
    pub value: u64,
    /// The rest of an override's time to live, when it has one.
    pub remaining: Option<Duration>,
}

/// A priority class's live weight and reserve (`None`: as configured).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ClassLive {
    /// The live weight.
    pub weight: Option<LiveValue>,
    /// The live reserve, in percent.
    pub reserve: Option<LiveValue>,
    /// The class's live shadow mode: 1 on, 0 off.
    pub shadow: Option<LiveValue>,
}

/// A priority class's setting that can be changed live.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ClassSetting {
    /// Its weight (1..=1000).
    Weight,
    /// Its reserved share of the limit, in percent (0..=100; the reserves of an upstream add
    /// up to at most 100).
    Reserve,
    /// Shadow mode for the class's calls: 1 on, 0 off.
    Shadow,
}

impl ClassSetting {
    /// Its name in the store (before `|<class>`) and on the command line.
    pub const fn as_str(self) -> &'static str {
        match self {
            ClassSetting::Weight => "weight",
            ClassSetting::Reserve => "reserve",
            ClassSetting::Shadow => "shadow",
        }
    }

    /// The range of its values.
    const fn range(self) -> (u64, u64) {
        match self {
            ClassSetting::Weight => (1, 1000),
            ClassSetting::Reserve => (0, 100),
            ClassSetting::Shadow => (0, 1),
        }
    }
}

/// Which live settings a process applied: their epoch and their version within it.
///
/// A version alone is not enough: after the store lost the settings (`FLUSHALL`, an eviction,
/// a Redis restarted empty) the versions start over, and a change whose version equals one a
/// process applied before the loss would look like nothing new to it. The epoch is written
/// with the first version (Redis `TIME` in µs; a [`LiveBoard`]'s first change, in µs) and is
/// new each time the settings start over, so a process whose epoch differs applies the
/// settings whole — nothing set included: back to its configured values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct LiveStamp {
    /// The epoch (0: none written yet: nothing was set since the settings started).
    pub epoch: u64,
    /// The version within the epoch (0: nothing was set).
    pub version: u64,
}

impl LiveStamp {
    /// The highest epoch or version accepted from a store: 2⁵³ − 1, the largest integer a Lua
    /// number holds exactly (a store answering more is answering garbage).
    pub const MAX: u64 = (1 << 53) - 1;
}

/// The live settings of one upstream under one version; a setting that is `None` is the
/// configured one.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct LiveSettings {
    /// The epoch of the settings (see [`LiveStamp`]; 0: none written yet).
    pub epoch: u64,
    /// The version within the epoch (0: nothing was ever set).
    pub version: u64,
    /// The live concurrency limit.
    pub limit: Option<LiveValue>,
    /// The live rate of the requests budget, a minute.
    pub requests_per_minute: Option<LiveValue>,
    /// The live rate of the tokens budget, a minute.
    pub tokens_per_minute: Option<LiveValue>,
    /// The live burst of the requests budget.
    pub requests_burst: Option<LiveValue>,
    /// The live burst of the tokens budget.
    pub tokens_burst: Option<LiveValue>,
    /// The upstream's live shadow mode: 1 on, 0 off.
    pub shadow: Option<LiveValue>,
    /// The mark of the last fleet-wide reset of a spent quota (an operator's `wavegate
    /// reset-quota`): a process that sees it change lifts its refusal of the upstream.
    pub quota_reset: Option<u64>,
    /// A spent quota one process met, told to the fleet: every process refuses the upstream
    /// for what is left of it (`remaining`).
    pub quota_spent: Option<LiveValue>,
    /// The priority classes' live weights and reserves, by class name.
    pub classes: BTreeMap<String, ClassLive>,
    /// This upstream's live weight as a member of each pool, by pool name (0: out of the
    /// pool; a pool it was not configured in takes it in). See [`LiveChange::pool_member`].
    pub pools: BTreeMap<String, LiveValue>,
}

impl LiveSettings {
    /// Nothing live, under `version`.
    pub fn empty(version: u64) -> Self {
        Self {
            epoch: 0,
            version,
            limit: None,
            requests_per_minute: None,
            tokens_per_minute: None,
            requests_burst: None,
            tokens_burst: None,
            shadow: None,
            quota_reset: None,
            quota_spent: None,
            classes: BTreeMap::new(),
            pools: BTreeMap::new(),
        }
    }

    /// The same settings, in `epoch`.
    #[must_use]
    pub fn in_epoch(mut self, epoch: u64) -> Self {
        self.epoch = epoch;
        self
    }

    /// Their epoch and version: what a process that applied them sends with its next look.
    pub fn stamp(&self) -> LiveStamp {
        LiveStamp { epoch: self.epoch, version: self.version }
    }

    /// Sets the setting the store names `name` (`limit`, `weight|<class>`, `quota_reset`, ...)
    /// to `value`; a name this build does not know, or a value out of its range, is ignored
    /// (the store is read, not trusted).
    pub fn with_named(mut self, name: &str, value: LiveValue) -> Self {
        if let Some(setting) = LiveSetting::parse(name) {
            return self.with(setting, value);
        }
        if name == QUOTA_RESET {
            self.quota_reset = Some(value.value);
            return self;
        }
        if name == QUOTA_SPENT {
            self.quota_spent = Some(value).filter(|v| v.remaining.is_some_and(|left| !left.is_zero()));
            return self;
        }
        let Some((kind, class)) = name.split_once('|') else { return self };
        if kind == POOL_MEMBER {
            if value.value <= u64::from(PoolConfig::MAX_WEIGHT) && UpstreamName::new(class).is_ok() {
                self.pools.insert(class.to_owned(), value);
            }
            return self;
        }
        let kind = match kind {
            "weight" => ClassSetting::Weight,
            "reserve" => ClassSetting::Reserve,
            "shadow" => ClassSetting::Shadow,
            _ => return self,
        };
        let (low, high) = kind.range();
        if (low..=high).contains(&value.value) && !class.is_empty() {
            let entry = self.classes.entry(class.to_owned()).or_default();
            match kind {
                ClassSetting::Weight => entry.weight = Some(value),
                ClassSetting::Reserve => entry.reserve = Some(value),
                ClassSetting::Shadow => entry.shadow = Some(value),
            }
        }
        self
    }

    /// Whether nothing is live (no setting, no class setting, no quota reset).
    pub fn is_empty(&self) -> bool {
        LiveSetting::ALL.iter().all(|s| self.get(*s).is_none())
            && self.classes.is_empty()
            && self.quota_reset.is_none()
            && self.quota_spent.is_none()
            && self.pools.is_empty()
    }

    /// Every override's shortest rest, if one has an end.
    pub fn next_end(&self) -> Option<Duration> {
        let classes = self.classes.values().flat_map(|c| [c.weight, c.reserve, c.shadow]).flatten();
        LiveSetting::ALL
            .iter()
            .filter_map(|s| self.get(*s))
            .chain(classes)
            .chain(self.quota_spent)
            .chain(self.pools.values().copied())
            .filter_map(|v| v.remaining)
            .min()
    }

    /// Sets `setting` to `value` (a value out of range for the setting — 0 but for the
    /// shadow mode, above 1 for it — is ignored: the store is read, not trusted).
    pub fn with(mut self, setting: LiveSetting, value: LiveValue) -> Self {
        let (low, high) = setting.range();
        let value = Some(value).filter(|v| (low..=high).contains(&v.value));
        match setting {
            LiveSetting::Limit => self.limit = value,
            LiveSetting::RequestsPerMinute => self.requests_per_minute = value,
            LiveSetting::TokensPerMinute => self.tokens_per_minute = value,
            LiveSetting::RequestsBurst => self.requests_burst = value,
            LiveSetting::TokensBurst => self.tokens_burst = value,
            LiveSetting::Shadow => self.shadow = value,
        }
        self
    }

    /// The live value of `setting`, if one is set.
    pub fn get(&self, setting: LiveSetting) -> Option<LiveValue> {
        match setting {
            LiveSetting::Limit => self.limit,
            LiveSetting::RequestsPerMinute => self.requests_per_minute,
            LiveSetting::TokensPerMinute => self.tokens_per_minute,
            LiveSetting::RequestsBurst => self.requests_burst,
            LiveSetting::TokensBurst => self.tokens_burst,
            LiveSetting::Shadow => self.shadow,
        }
    }

    /// The live value of `setting` as a positive `u32`, if one is set.
    pub fn get_u32(&self, setting: LiveSetting) -> Option<NonZeroU32> {
        self.get(setting).and_then(|v| u32::try_from(v.value).ok()).and_then(NonZeroU32::new)
    }

    /// `configured` with these settings in force: the live limit, and the live rates and
    /// bursts of the budgets it has (each as configured where none is live; a rate or a burst
    /// for a budget it does not have is not applied).
    pub fn apply_to(&self, configured: &UpstreamConfig) -> UpstreamConfig {
        let mut budgets = configured.budgets();
        let live = |b: Option<RateBudget>, rate, burst| {
            b.map(|b| {
                let rate = self.get_u32(rate).map_or(b.per_minute(), NonZeroU32::get);
                let burst = self.get_u32(burst).map_or(b.burst(), NonZeroU32::get);
                RateBudget::new(rate, burst).unwrap_or(b)
            })
        };
        budgets.requests = live(budgets.requests, LiveSetting::RequestsPerMinute, LiveSetting::RequestsBurst);
        budgets.tokens = live(budgets.tokens, LiveSetting::TokensPerMinute, LiveSetting::TokensBurst);
        let config = configured.with_limit(self.limit_or(configured.limit())).with_budgets(budgets);
        let config = config.with_shadow(self.shadow_applied(configured.shadow()));
        self.apply_classes(config)
    }

    /// `configured` with the live shadow modes: the upstream's, then each class's.
    pub fn shadow_applied(&self, configured: &ShadowScope) -> ShadowScope {
        let on = |value: LiveValue| value.value == 1;
        let scope = configured.clone().with_upstream(self.shadow.map_or(configured.is_upstream(), on));
        self.classes
            .iter()
            .filter_map(|(class, live)| live.shadow.map(|value| (class, on(value))))
            .fold(scope, |scope, (class, on)| scope.with_class(class, on))
    }

    /// `config` with the classes' live weights and reserves; unchanged when they do not fit
    /// it (a class it does not have, reserves above 100 % together).
    fn apply_classes(&self, config: UpstreamConfig) -> UpstreamConfig {
        self.classes_applied(config.classes())
            .and_then(|classes| config.with_class_shares(&classes).ok())
            .unwrap_or(config)
    }

    /// `classes` (an upstream's, in order) with their live weights and reserves: `None` when
    /// none is live for them, or when the result would not be valid (reserves above 100 %
    /// together).
    pub fn classes_applied(&self, classes: &[PriorityClass]) -> Option<Vec<PriorityClass>> {
        if self.classes.is_empty() || !classes.iter().any(|c| self.classes.contains_key(c.name())) {
            return None;
        }
        let applied: Vec<PriorityClass> = classes
            .iter()
            .map(|class| {
                let live = self.classes.get(class.name()).copied().unwrap_or_default();
                let weight = live.weight.map_or(class.weight_value().get(), |v| v.value as u32);
                let reserve = live.reserve.map_or(class.reserve_percent_value(), |v| v.value as u8);
                class.clone().weight(weight).and_then(|c| c.reserve_percent(reserve))
            })
            .collect::<Result<_, _>>()
            .ok()?;
        crate::priority::validate("live", &applied).ok()?;
        Some(applied)
    }

    /// The live limit, if one is set.
    pub fn live_limit(&self) -> Option<NonZeroU32> {
        self.get_u32(LiveSetting::Limit)
    }

    /// The limit in force: the live one, else `configured`.
    pub fn limit_or(&self, configured: NonZeroU32) -> NonZeroU32 {
        self.live_limit().unwrap_or(configured)
    }
}

/// A live change refused before anything was stored.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LiveError {
    /// A limit or a rate of 0.
    #[error("{setting} 0 admits nothing; set it to at least 1")]
    ZeroValue {
        /// The setting.
        setting: &'static str,
    },
    /// A value the setting cannot hold.
    #[error("{setting} {value} is out of range; the most is {max}")]
    OutOfRange {
        /// The setting.
        setting: &'static str,
        /// The value given.
        value: u64,
        /// The largest accepted.
        max: u64,
    },
    /// A rate for a budget the upstream is not configured with (a live change sets a budget's
    /// rate; it does not make one).
    #[error("{setting}: the upstream has no such budget configured; a live change only changes a configured rate")]
    NoSuchBudget {
        /// The setting.
        setting: &'static str,
    },
    /// A class the upstream does not have, or a class setting that would not fit its
    /// classes (reserves above 100 % together).
    #[error("{0}")]
    BadClass(String),
    /// A pool name that cannot be one, or a member's weight above 1000.
    #[error("{0}")]
    BadPoolMember(String),
    /// An override's time to live of zero or longer than accepted.
    #[error("an override must last between 1 ms and {max:?}; got {given:?}")]
    BadTimeToLive {
        /// The time to live given.
        given: Duration,
        /// The longest accepted.
        max: Duration,
    },
}

/// One live change, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LiveChange {
    /// `setting` becomes `value`; with a time to live, only for that long.
    Set {
        /// The setting.
        setting: LiveSetting,
        /// The value.
        value: u64,
        /// How long it holds (`None`: until changed).
        ttl: Option<Duration>,
    },
    /// `setting` goes back to the configured value.
    Clear(LiveSetting),
    /// A priority class's `setting` becomes `value`; with a time to live, only for that long.
    SetClass {
        /// The class.
        class: String,
        /// The setting.
        setting: ClassSetting,
        /// The value.
        value: u64,
        /// How long it holds (`None`: until changed).
        ttl: Option<Duration>,
    },
    /// A priority class's `setting` goes back to the configured value.
    ClearClass {
        /// The class.
        class: String,
        /// The setting.
        setting: ClassSetting,
    },
    /// The upstream's weight as a member of pool `pool` becomes `weight` (0: out of the pool;
    /// an upstream the pool was not configured with joins it); with a time to live, only for
    /// that long. Built with [`LiveChange::pool_member`].
    SetPoolMember {
        /// The pool.
        pool: String,
        /// The weight (0..=1000).
        weight: u32,
        /// How long it holds (`None`: until changed).
        ttl: Option<Duration>,
    },
    /// The upstream's membership of pool `pool` goes back to the configured one (its
    /// configured weight if it is a configured member, out of the pool otherwise).
    ClearPoolMember {
        /// The pool.
        pool: String,
    },
}

impl LiveChange {
    /// The longest override: 7 days (as [`UpstreamConfig::MAX_DURATION`](crate::UpstreamConfig::MAX_DURATION)).
    pub const MAX_TTL: Duration = crate::UpstreamConfig::MAX_DURATION;

    /// `setting` set to `value`, for `ttl` if given.
    ///
    /// # Errors
    ///
    /// [`LiveError`] when the value or the time to live cannot be used.
    pub fn set(setting: LiveSetting, value: u64, ttl: Option<Duration>) -> Result<Self, LiveError> {
        let (low, high) = setting.range();
        if value < low {
            return Err(LiveError::ZeroValue { setting: setting.as_str() });
        }
        if value > high {
            return Err(LiveError::OutOfRange { setting: setting.as_str(), value, max: high });
        }
        check_ttl(ttl)?;
        Ok(Self::Set { setting, value, ttl })
    }

    /// Shadow mode for the whole upstream on or off (see [`ShadowScope`]), for `ttl` if
    /// given (then back to the configured mode).
    ///
    /// # Errors
    ///
    /// [`LiveError::BadTimeToLive`] when the time to live cannot be used.
    pub fn shadow(on: bool, ttl: Option<Duration>) -> Result<Self, LiveError> {
        Self::set(LiveSetting::Shadow, u64::from(on), ttl)
    }

    /// Priority class `class`'s `setting` set to `value`, for `ttl` if given.
    ///
    /// # Errors
    ///
    /// [`LiveError`] when the value or the time to live cannot be used, or `class` is not a
    /// class name.
    pub fn set_class(
        class: impl Into<String>,
        setting: ClassSetting,
        value: u64,
        ttl: Option<Duration>,
    ) -> Result<Self, LiveError> {
        let class = class.into();
        if crate::priority::PriorityClass::new(class.clone()).is_err() {
            return Err(LiveError::BadClass(format!("{class:?} is not a class name")));
        }
        let (low, high) = setting.range();
        if !(low..=high).contains(&value) {
            return Err(LiveError::BadClass(format!(
                "{} {value} of class {class} is outside {low}..={high}",
                setting.as_str()
            )));
        }
        check_ttl(ttl)?;
        Ok(Self::SetClass { class, setting, value, ttl })
    }

    /// The upstream's weight as a member of pool `pool` set to `weight`, for `ttl` if given:
    /// 0 takes it out of the pool (requests to the pool no longer pick it; those already on it
    /// finish there), 1..=1000 puts it in with that weight — also into a pool it was not
    /// configured in, where it comes after the configured members (for
    /// [`PoolPolicy::Spillover`](crate::PoolPolicy::Spillover), whose order is the members').
    ///
    /// # Errors
    ///
    /// [`LiveError::BadPoolMember`] for a pool name that cannot be one or a weight above
    /// 1000; [`LiveError::BadTimeToLive`] when the time to live cannot be used.
    pub fn pool_member(pool: impl Into<String>, weight: u32, ttl: Option<Duration>) -> Result<Self, LiveError> {
        let pool = pool.into();
        if UpstreamName::new(pool.clone()).is_err() {
            return Err(LiveError::BadPoolMember(format!("{pool:?} is not a pool name")));
        }
        if weight > PoolConfig::MAX_WEIGHT {
            return Err(LiveError::BadPoolMember(format!(
                "weight {weight} in pool {pool} is above {}; 0 takes the member out",
                PoolConfig::MAX_WEIGHT
            )));
        }
        check_ttl(ttl)?;
        Ok(Self::SetPoolMember { pool, weight, ttl })
    }

    /// The name of what it changes, as the store keeps it: `limit`, `requests_per_minute`,
    /// `weight|<class>`, `member|<pool>`, ...
    pub fn name(&self) -> String {
        match self {
            LiveChange::Set { setting, .. } | LiveChange::Clear(setting) => setting.as_str().to_owned(),
            LiveChange::SetClass { class, setting, .. } | LiveChange::ClearClass { class, setting } => {
                format!("{}|{class}", setting.as_str())
            }
            LiveChange::SetPoolMember { pool, .. } | LiveChange::ClearPoolMember { pool } => {
                format!("{POOL_MEMBER}|{pool}")
            }
        }
    }

    /// The value it sets and for how long (`None` for a clear).
    pub fn value(&self) -> Option<(u64, Option<Duration>)> {
        match *self {
            LiveChange::Set { value, ttl, .. } | LiveChange::SetClass { value, ttl, .. } => Some((value, ttl)),
            LiveChange::SetPoolMember { weight, ttl, .. } => Some((u64::from(weight), ttl)),
            LiveChange::Clear(_) | LiveChange::ClearClass { .. } | LiveChange::ClearPoolMember { .. } => None,
        }
    }

    /// Whether the upstream `config` can take this change: a rate only for a budget it has, a
    /// class setting only for a class it has (a reserve only if the configured reserves of
    /// the others leave room for it).
    ///
    /// # Errors
    ///
    /// [`LiveError::NoSuchBudget`] for the rate of a budget `config` does not have,
    /// [`LiveError::BadClass`] for a class it does not have or a reserve that does not fit.
    pub fn check_for(&self, config: &UpstreamConfig) -> Result<(), LiveError> {
        if let LiveChange::SetClass { class, .. } | LiveChange::ClearClass { class, .. } = self
            && config.class_index(class).is_none()
        {
            return Err(LiveError::BadClass(format!("the upstream has no class {class:?}")));
        }
        if let LiveChange::SetClass { class, setting: ClassSetting::Reserve, value, .. } = self {
            let others: u64 = config
                .classes()
                .iter()
                .filter(|c| c.name() != class)
                .map(|c| u64::from(c.reserve_percent_value()))
                .sum();
            if others + value > 100 {
                return Err(LiveError::BadClass(format!(
                    "reserve {value} % of class {class} with the others' {others} % is above 100 %"
                )));
            }
        }
        let LiveChange::Set { setting, .. } = *self else { return Ok(()) };
        let missing = match setting {
            LiveSetting::Limit | LiveSetting::Shadow => false,
            LiveSetting::RequestsPerMinute | LiveSetting::RequestsBurst => config.budgets().requests.is_none(),
            LiveSetting::TokensPerMinute | LiveSetting::TokensBurst => config.budgets().tokens.is_none(),
        };
        if missing { Err(LiveError::NoSuchBudget { setting: setting.as_str() }) } else { Ok(()) }
    }

    /// The upstream setting it changes (`None` for a class's).
    pub fn setting(&self) -> Option<LiveSetting> {
        match *self {
            LiveChange::Set { setting, .. } | LiveChange::Clear(setting) => Some(setting),
            LiveChange::SetClass { .. }
            | LiveChange::ClearClass { .. }
            | LiveChange::SetPoolMember { .. }
            | LiveChange::ClearPoolMember { .. } => None,
        }
    }
}

/// The store's name of the mark of the last fleet-wide reset of a spent quota.
pub(crate) const QUOTA_RESET: &str = "quota_reset";

/// The store's name of an upstream's weight in a pool, before `|<pool>`.
const POOL_MEMBER: &str = "member";

/// The store's name of a spent quota told to the fleet (with the pause as its time to live).
pub const QUOTA_SPENT: &str = "quota_spent";

fn check_ttl(ttl: Option<Duration>) -> Result<(), LiveError> {
    match ttl.filter(|ttl| duration_ms(*ttl) == 0 || *ttl > LiveChange::MAX_TTL) {
        Some(given) => Err(LiveError::BadTimeToLive { given, max: LiveChange::MAX_TTL }),
        None => Ok(()),
    }
}

/// The live settings of one upstream held in process (local mode): the twin of `lua/live.lua`.
///
/// Like the store, it writes its epoch with its first version (the time of that change, in
/// µs); a board is never flushed, so its epoch never changes after that.
#[derive(Debug, Clone, Default)]
pub struct LiveBoard {
    epoch: u64,
    version: u64,
    /// Each live setting's value and when it ends (ms), if it has an end, by the store's name.
    values: HashMap<String, (u64, Option<u64>)>,
}

impl LiveBoard {
    /// Applies `change` at `now_ms`; answers the new version.
    pub fn apply(&mut self, change: &LiveChange, now_ms: u64) -> u64 {
        match change.value() {
            Some((value, ttl)) => {
                self.values.insert(change.name(), (value, ttl.map(|ttl| now_ms.saturating_add(duration_ms(ttl)))));
            }
            None => {
                self.values.remove(&change.name());
            }
        }
        self.bump(now_ms);
        self.version
    }

    /// A new version, with the epoch written if there is none yet (as `live.lua` does).
    fn bump(&mut self, now_ms: u64) {
        if self.epoch == 0 {
            self.epoch = now_ms.saturating_mul(1000).clamp(1, LiveStamp::MAX);
        }
        self.version += 1;
    }

    /// The settings at `now_ms`: the overrides whose time is up are dropped first, under one
    /// new version.
    pub fn read(&mut self, now_ms: u64) -> LiveSettings {
        let before = self.values.len();
        self.values.retain(|_, (_, until)| until.is_none_or(|until| until > now_ms));
        if self.values.len() != before {
            self.bump(now_ms);
        }
        let mut settings = LiveSettings::empty(self.version).in_epoch(self.epoch);
        for (name, &(value, until)) in &self.values {
            let remaining = until.map(|until| Duration::from_millis(until.saturating_sub(now_ms)));
            settings = settings.with_named(name, LiveValue { value, remaining });
        }
        settings
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_change_is_validated_before_it_is_stored() {
        assert_eq!(LiveChange::set(LiveSetting::Limit, 0, None), Err(LiveError::ZeroValue { setting: "limit" }));
        assert!(matches!(LiveChange::set(LiveSetting::Limit, 1 << 40, None), Err(LiveError::OutOfRange { .. })));
        let zero = LiveChange::set(LiveSetting::Limit, 3, Some(Duration::ZERO));
        assert!(matches!(zero, Err(LiveError::BadTimeToLive { .. })));
        let long = LiveChange::set(LiveSetting::Limit, 3, Some(LiveChange::MAX_TTL + Duration::from_secs(1)));
        assert!(matches!(long, Err(LiveError::BadTimeToLive { .. })));
        assert_eq!(LiveSetting::parse("limit"), Some(LiveSetting::Limit));
        assert_eq!(LiveSetting::parse("nope"), None);
    }

    #[test]
    fn the_board_versions_each_change_and_reverts_an_override_once() {
        let ten = NonZeroU32::new(10).unwrap();
        let mut board = LiveBoard::default();
        assert_eq!(board.read(0), LiveSettings::empty(0));
        let set = LiveChange::set(LiveSetting::Limit, 20, None).unwrap();
        assert_eq!(board.apply(&set, 7), 1);
        let epoch = board.read(8).epoch;
        assert_eq!(epoch, 7_000, "the epoch is written with the first version, as the store writes it");
        assert_eq!(board.read(1_000_000).limit_or(ten).get(), 20, "a plain set stays");
        let brief = LiveChange::set(LiveSetting::Limit, 2, Some(Duration::from_millis(500))).unwrap();
        assert_eq!(board.apply(&brief, 1_000), 2);
        let during = board.read(1_499);
        assert_eq!((during.version, during.limit_or(ten).get()), (2, 2));
        assert_eq!(during.limit.unwrap().remaining, Some(Duration::from_millis(1)));
        let after = board.read(1_500);
        assert_eq!((after.version, after.limit_or(ten).get()), (3, 10), "reverted to the configured limit");
        assert_eq!(board.read(2_000).version, 3, "reverted once");
        assert_eq!(board.apply(&LiveChange::Clear(LiveSetting::Limit), 2_000), 4);
        assert_eq!(board.read(2_000).stamp(), LiveStamp { epoch, version: 4 }, "a board keeps its epoch");
    }

    #[test]
    fn live_rates_change_the_configured_budgets_only() {
        let plain = UpstreamConfig::builder("p").limit(4).build().unwrap();
        let budgeted = UpstreamConfig::builder("b").limit(4).requests_per_minute(600, 20).build().unwrap();
        let rpm = LiveChange::set(LiveSetting::RequestsPerMinute, 60, None).unwrap();
        assert_eq!(rpm.check_for(&plain), Err(LiveError::NoSuchBudget { setting: "requests_per_minute" }));
        assert_eq!(rpm.check_for(&budgeted), Ok(()));
        let tpm = LiveChange::set(LiveSetting::TokensPerMinute, 60, None).unwrap();
        assert!(tpm.check_for(&budgeted).is_err());
        let mut board = LiveBoard::default();
        board.apply(&rpm, 0);
        board.apply(&tpm, 0);
        let settings = board.read(0);
        let applied = settings.apply_to(&budgeted);
        assert_eq!(applied.budgets().requests, RateBudget::new(60, 20), "the rate changes, the burst stays");
        assert_eq!(applied.budgets().tokens, None, "a rate for a budget it does not have is not applied");
        assert_eq!(applied.limit().get(), 4);
        assert_eq!(settings.apply_to(&plain).budgets(), plain.budgets());
        // A burst: the rate stays as set (live or configured), and only a configured budget's.
        let burst = LiveChange::set(LiveSetting::RequestsBurst, 3, None).unwrap();
        assert_eq!(burst.check_for(&budgeted), Ok(()));
        assert_eq!(burst.check_for(&plain), Err(LiveError::NoSuchBudget { setting: "requests_burst" }));
        assert!(LiveChange::set(LiveSetting::TokensBurst, 3, None).unwrap().check_for(&budgeted).is_err());
        assert_eq!(LiveSetting::parse("tokens_burst"), Some(LiveSetting::TokensBurst));
        board.apply(&burst, 0);
        assert_eq!(board.read(0).apply_to(&budgeted).budgets().requests, RateBudget::new(60, 3), "both live");
        board.apply(&LiveChange::Clear(LiveSetting::RequestsPerMinute), 0);
        assert_eq!(board.read(0).apply_to(&budgeted).budgets().requests, RateBudget::new(600, 3), "rate configured");
    }

    #[test]
    fn a_pool_membership_is_stored_read_back_and_reverts() {
        let out = LiveChange::pool_member("gpt", 0, Some(Duration::from_secs(60))).unwrap();
        assert_eq!(out.name(), "member|gpt");
        assert_eq!(out.value(), Some((0, Some(Duration::from_secs(60)))));
        assert!(matches!(LiveChange::pool_member("gpt", 1001, None), Err(LiveError::BadPoolMember(_))));
        assert!(matches!(LiveChange::pool_member("a b", 1, None), Err(LiveError::BadPoolMember(_))));
        let mut board = LiveBoard::default();
        board.apply(&out, 0);
        board.apply(&LiveChange::pool_member("claude", 7, None).unwrap(), 0);
        let settings = board.read(1_000);
        assert_eq!(settings.pools["gpt"], LiveValue { value: 0, remaining: Some(Duration::from_secs(59)) });
        assert_eq!(settings.pools["claude"].value, 7);
        assert_eq!(settings.next_end(), Some(Duration::from_secs(59)), "the override's end is looked at");
        assert!(!settings.is_empty());
        assert!(!board.read(60_000).pools.contains_key("gpt"), "the override reverted");
        board.apply(&LiveChange::ClearPoolMember { pool: "claude".into() }, 60_000);
        assert!(board.read(60_000).is_empty());
        // Read from the store, not trusted: a weight above 1000 or a name that cannot be a
        // pool's is dropped.
        let held = LiveValue { value: 1001, remaining: None };
        assert!(LiveSettings::empty(1).with_named("member|gpt", held).pools.is_empty());
        let bad = LiveValue { value: 1, remaining: None };
        assert!(LiveSettings::empty(1).with_named("member|", bad).pools.is_empty());
    }

    #[test]
    fn class_weights_and_reserves_apply_when_they_fit() {
        let config = UpstreamConfig::builder("c")
            .class("interactive", 3)
            .class("batch", 1)
            .reserve("interactive", 20)
            .build()
            .unwrap();
        let weight = LiveChange::set_class("batch", ClassSetting::Weight, 6, None).unwrap();
        assert_eq!(weight.name(), "weight|batch");
        assert_eq!(weight.check_for(&config), Ok(()));
        let nope = LiveChange::set_class("nope", ClassSetting::Weight, 6, None).unwrap();
        assert!(matches!(nope.check_for(&config), Err(LiveError::BadClass(_))));
        let too_much = LiveChange::set_class("batch", ClassSetting::Reserve, 90, None).unwrap();
        assert!(matches!(too_much.check_for(&config), Err(LiveError::BadClass(_))), "20 + 90 > 100");
        assert!(LiveChange::set_class("batch", ClassSetting::Weight, 0, None).is_err());
        assert!(LiveChange::set_class("batch", ClassSetting::Weight, 1001, None).is_err());
        assert!(LiveChange::set_class("a b", ClassSetting::Weight, 1, None).is_err());
        let mut board = LiveBoard::default();
        board.apply(&weight, 0);
        board.apply(&LiveChange::set_class("interactive", ClassSetting::Reserve, 0, None).unwrap(), 0);
        let applied = board.read(0).apply_to(&config);
        let shares: Vec<(u32, u8)> =
            applied.classes().iter().map(|c| (c.weight_value().get(), c.reserve_percent_value())).collect();
        assert_eq!(shares, [(3, 0), (6, 0)]);
        // Reserves that would add up to more than 100 % leave the classes as configured.
        let mut board = LiveBoard::default();
        board.apply(&LiveChange::set_class("batch", ClassSetting::Reserve, 90, None).unwrap(), 0);
        assert_eq!(board.read(0).apply_to(&config).classes(), config.classes());
        board.apply(&LiveChange::ClearClass { class: "batch".into(), setting: ClassSetting::Reserve }, 0);
        assert!(board.read(0).is_empty());
    }

    #[test]
    fn a_value_the_store_should_not_hold_is_ignored() {
        let ten = NonZeroU32::new(10).unwrap();
        let zero = LiveSettings::empty(1).with(LiveSetting::Limit, LiveValue { value: 0, remaining: None });
        assert_eq!(zero.limit, None);
        assert_eq!(zero.limit_or(ten), ten);
    }
}
