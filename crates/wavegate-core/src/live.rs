//! Live settings: what an operator changes while the fleet runs, over the configuration each
//! process was built with.
//!
//! A change is stored with a version — in the shared store for the fleet (`lua/live.lua`), or
//! on a [`LiveBoard`] in local mode — and every process compares the version it applied with
//! the stored one about once a second; a new version is read and applied whole. A value set
//! with a time to live (an override) reverts to each process's configured value when it runs
//! out: the store (or the board) drops it at the first look after its end and bumps the
//! version, so a process started after the change sees the same thing as one that saw it
//! made.
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

use std::collections::HashMap;
use std::num::NonZeroU32;
use std::time::Duration;

use crate::clock::duration_ms;
use crate::config::UpstreamConfig;
use crate::gcra::RateBudget;

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
}

impl LiveSetting {
    /// Every live setting.
    pub const ALL: [LiveSetting; 3] =
        [LiveSetting::Limit, LiveSetting::RequestsPerMinute, LiveSetting::TokensPerMinute];

    /// Its name in the store and on the command line.
    pub const fn as_str(self) -> &'static str {
        match self {
            LiveSetting::Limit => "limit",
            LiveSetting::RequestsPerMinute => "requests_per_minute",
            LiveSetting::TokensPerMinute => "tokens_per_minute",
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

/// The live settings of one upstream under one version; a setting that is `None` is the
/// configured one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct LiveSettings {
    /// The version (0: nothing was ever set).
    pub version: u64,
    /// The live concurrency limit.
    pub limit: Option<LiveValue>,
    /// The live rate of the requests budget, a minute.
    pub requests_per_minute: Option<LiveValue>,
    /// The live rate of the tokens budget, a minute.
    pub tokens_per_minute: Option<LiveValue>,
    /// The mark of the last fleet-wide reset of a spent quota (an operator's `wavegate
    /// reset-quota`): a process that sees it change lifts its refusal of the upstream.
    pub quota_reset: Option<u64>,
}

impl LiveSettings {
    /// Nothing live, under `version`.
    pub fn empty(version: u64) -> Self {
        Self { version, limit: None, requests_per_minute: None, tokens_per_minute: None, quota_reset: None }
    }

    /// Sets `setting` to `value` (a value 0 or out of range for the setting is ignored: the
    /// store is read, not trusted).
    pub fn with(mut self, setting: LiveSetting, value: LiveValue) -> Self {
        let value = Some(value).filter(|v| v.value >= 1 && v.value <= u64::from(u32::MAX));
        match setting {
            LiveSetting::Limit => self.limit = value,
            LiveSetting::RequestsPerMinute => self.requests_per_minute = value,
            LiveSetting::TokensPerMinute => self.tokens_per_minute = value,
        }
        self
    }

    /// The live value of `setting`, if one is set.
    pub fn get(&self, setting: LiveSetting) -> Option<LiveValue> {
        match setting {
            LiveSetting::Limit => self.limit,
            LiveSetting::RequestsPerMinute => self.requests_per_minute,
            LiveSetting::TokensPerMinute => self.tokens_per_minute,
        }
    }

    /// The live value of `setting` as a positive `u32`, if one is set.
    pub fn get_u32(&self, setting: LiveSetting) -> Option<NonZeroU32> {
        self.get(setting).and_then(|v| u32::try_from(v.value).ok()).and_then(NonZeroU32::new)
    }

    /// `configured` with these settings in force: the live limit, and the live rates of the
    /// budgets it has (their bursts as configured; a rate for a budget it does not have is
    /// not applied).
    pub fn apply_to(&self, configured: &UpstreamConfig) -> UpstreamConfig {
        let mut budgets = configured.budgets();
        let rate = |b: Option<RateBudget>, setting| {
            b.map(|b| self.get_u32(setting).and_then(|r| RateBudget::new(r.get(), b.burst())).unwrap_or(b))
        };
        budgets.requests = rate(budgets.requests, LiveSetting::RequestsPerMinute);
        budgets.tokens = rate(budgets.tokens, LiveSetting::TokensPerMinute);
        configured.with_limit(self.limit_or(configured.limit())).with_budgets(budgets)
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
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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
        if value == 0 {
            return Err(LiveError::ZeroValue { setting: setting.as_str() });
        }
        if value > u64::from(u32::MAX) {
            return Err(LiveError::OutOfRange { setting: setting.as_str(), value, max: u64::from(u32::MAX) });
        }
        if let Some(given) = ttl.filter(|ttl| duration_ms(*ttl) == 0 || *ttl > Self::MAX_TTL) {
            return Err(LiveError::BadTimeToLive { given, max: Self::MAX_TTL });
        }
        Ok(Self::Set { setting, value, ttl })
    }

    /// Whether the upstream `config` can take this change: a rate only for a budget it has.
    ///
    /// # Errors
    ///
    /// [`LiveError::NoSuchBudget`] for the rate of a budget `config` does not have.
    pub fn check_for(&self, config: &UpstreamConfig) -> Result<(), LiveError> {
        let LiveChange::Set { setting, .. } = *self else { return Ok(()) };
        let missing = match setting {
            LiveSetting::Limit => false,
            LiveSetting::RequestsPerMinute => config.budgets().requests.is_none(),
            LiveSetting::TokensPerMinute => config.budgets().tokens.is_none(),
        };
        if missing { Err(LiveError::NoSuchBudget { setting: setting.as_str() }) } else { Ok(()) }
    }

    /// The setting it changes.
    pub fn setting(&self) -> LiveSetting {
        match *self {
            LiveChange::Set { setting, .. } | LiveChange::Clear(setting) => setting,
        }
    }
}

/// The live settings of one upstream held in process (local mode): the twin of `lua/live.lua`.
#[derive(Debug, Clone, Default)]
pub struct LiveBoard {
    version: u64,
    /// Each live setting's value and when it ends (ms), if it has an end.
    values: HashMap<LiveSetting, (u64, Option<u64>)>,
}

impl LiveBoard {
    /// Applies `change` at `now_ms`; answers the new version.
    pub fn apply(&mut self, change: &LiveChange, now_ms: u64) -> u64 {
        match *change {
            LiveChange::Set { setting, value, ttl } => {
                self.values.insert(setting, (value, ttl.map(|ttl| now_ms.saturating_add(duration_ms(ttl)))));
            }
            LiveChange::Clear(setting) => {
                self.values.remove(&setting);
            }
        }
        self.version += 1;
        self.version
    }

    /// The settings at `now_ms`: the overrides whose time is up are dropped first, under one
    /// new version.
    pub fn read(&mut self, now_ms: u64) -> LiveSettings {
        let before = self.values.len();
        self.values.retain(|_, (_, until)| until.is_none_or(|until| until > now_ms));
        if self.values.len() != before {
            self.version += 1;
        }
        let mut settings = LiveSettings::empty(self.version);
        for (&setting, &(value, until)) in &self.values {
            let remaining = until.map(|until| Duration::from_millis(until.saturating_sub(now_ms)));
            settings = settings.with(setting, LiveValue { value, remaining });
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
        assert_eq!(board.apply(&set, 0), 1);
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
    }

    #[test]
    fn a_value_the_store_should_not_hold_is_ignored() {
        let ten = NonZeroU32::new(10).unwrap();
        let zero = LiveSettings::empty(1).with(LiveSetting::Limit, LiveValue { value: 0, remaining: None });
        assert_eq!(zero.limit, None);
        assert_eq!(zero.limit_or(ten), ten);
    }
}
