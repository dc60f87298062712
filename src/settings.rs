//! The scheduler's configuration as data (feature `config`): a TOML file, the environment, or
//! both, with the builders' validation and messages.
//!
//! ```toml
//! redis = "redis://127.0.0.1:6379/"   # omit for local mode
//! redis_prefix = "billing"             # the key prefix (default "wavegate")
//!
//! [upstreams.llm]
//! limit = 10
//! max_wait = "25s"
//! renewed_lease = "3s"
//! tokens_per_minute = { per_minute = 200000, burst = 16000 }
//! ```
//!
//! The environment says the same with `WAVEGATE__` and `__` between the levels, e.g.
//! `WAVEGATE__UPSTREAMS__LLM__LIMIT=10` or `WAVEGATE__UPSTREAMS__LLM__TOKENS_PER_MINUTE__BURST=16000`
//! (names are lower-cased; values are read as integers, `true`/`false`, or strings). What the
//! environment sets overrides the file. Durations are `"250ms"`, `"25s"`, `"2m"`, `"1h"` or a
//! whole number of seconds. `docs/wavegate.example.toml` lists every key.
//!
//! ```
//! use wavegate::settings::Settings;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let file = r#"
//!     [upstreams.llm]
//!     limit = 10
//!     max_wait = "5s"
//! "#;
//! let env = [("WAVEGATE__UPSTREAMS__LLM__LIMIT", "4")];
//! let settings = Settings::from_sources(Some(file), env)?;
//! let scheduler = settings.builder()?.build()?;
//! assert_eq!(scheduler.upstream("llm")?.config().limit().get(), 4);
//!
//! // The builders' validation, with their messages:
//! let invalid = Settings::from_toml("[upstreams.llm]\nlimit = 0")?.builder().unwrap_err();
//! assert!(invalid.to_string().contains("limit"));
//! # Ok(()) }
//! ```

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Deserialize;
use wavegate_core::{Recovery, UpstreamConfig};
#[cfg(feature = "redis")]
use wavegate_redis::{StoreConfig, StoreError};

use crate::build_error::BuildError;
use crate::scheduler::{Scheduler, SchedulerBuilder};

/// The prefix of the environment variables read by [`Settings::from_sources`].
pub const ENV_PREFIX: &str = "WAVEGATE__";

/// Why settings could not be read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SettingsError {
    /// The TOML (or what the environment amounts to) does not describe settings; the message
    /// names the key.
    #[error("wavegate settings: {0}")]
    Invalid(String),
}

/// Everything a scheduler is built from.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct Settings {
    /// The Redis URL for shared mode; absent: local mode.
    #[serde(default)]
    pub redis: Option<String>,
    /// The longest one Redis command may take (default 250 ms).
    #[serde(default, deserialize_with = "duration::deserialize")]
    pub redis_command_timeout: Option<Duration>,
    /// The longest a Redis connection attempt may take (default 500 ms).
    #[serde(default, deserialize_with = "duration::deserialize")]
    pub redis_connect_timeout: Option<Duration>,
    /// The prefix of every Redis key and channel (default `wavegate`): one per application
    /// sharing a Redis.
    #[serde(default)]
    pub redis_prefix: Option<String>,
    /// Find the Redis primary through Sentinel; `redis` then gives only the scheme,
    /// credentials and database (its host is ignored; default `redis://sentinel-managed/`).
    #[serde(default)]
    pub redis_sentinel: Option<SentinelSettings>,
    /// A PEM file with the root certificate a `rediss://` server must chain to, instead of
    /// the system's roots (feature `tls`).
    #[serde(default)]
    pub redis_root_certificate: Option<std::path::PathBuf>,
    /// The upstreams, by name.
    #[serde(default)]
    pub upstreams: BTreeMap<String, UpstreamSettings>,
}

/// Redis Sentinel: the master's name and the sentinels.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct SentinelSettings {
    /// The name the sentinels monitor the primary under.
    pub master: String,
    /// The sentinels, `host:port`: a list, or one string with commas between them (as an
    /// environment variable gives it).
    pub sentinels: Addresses,
}

/// A list of addresses, or one comma-separated string of them.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(untagged)]
pub enum Addresses {
    /// `["10.0.0.1:26379", "10.0.0.2:26379"]`.
    List(Vec<String>),
    /// `"10.0.0.1:26379,10.0.0.2:26379"`.
    Joined(String),
}

impl Default for Addresses {
    fn default() -> Self {
        Addresses::List(Vec::new())
    }
}

impl Addresses {
    /// The addresses, one by one.
    pub fn to_vec(&self) -> Vec<String> {
        match self {
            Addresses::List(list) => list.clone(),
            Addresses::Joined(text) => {
                text.split(',').map(str::trim).filter(|a| !a.is_empty()).map(str::to_owned).collect()
            }
        }
    }
}

/// One upstream; every key is optional and defaults as the builder's does.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct UpstreamSettings {
    /// Fleet-wide concurrent calls.
    pub limit: Option<u32>,
    /// The longest a caller waits for a permit.
    #[serde(default, deserialize_with = "duration::deserialize")]
    pub max_wait: Option<Duration>,
    /// One attempt's timeout.
    #[serde(default, deserialize_with = "duration::deserialize")]
    pub call_timeout: Option<Duration>,
    /// A whole call's timeout, retries included.
    #[serde(default, deserialize_with = "duration::deserialize")]
    pub total_timeout: Option<Duration>,
    /// How long a permit stays held after its call was cancelled while at the provider.
    #[serde(default, deserialize_with = "duration::deserialize")]
    pub cancelled_call_hold: Option<Duration>,
    /// Whether transient failures (500–504, a reset before any byte) are retried; `false` for
    /// calls that are not safe to repeat (default `true`).
    pub retry_transient: Option<bool>,
    /// Whether the provider keeps a served request's whole token estimate charged (OpenAI
    /// does): settlements never refund below the reservation (default `false`).
    pub keeps_estimate: Option<bool>,
    /// What a cached input read weighs, 0.0–1.0 (default: as the provider reports the input).
    pub cache_read_weight: Option<f64>,
    /// A permit's lease, renewed while the call runs.
    #[serde(default, deserialize_with = "duration::deserialize")]
    pub renewed_lease: Option<Duration>,
    /// A fixed permit TTL instead of a renewed lease.
    #[serde(default, deserialize_with = "duration::deserialize")]
    pub permit_ttl: Option<Duration>,
    /// Permits of this process while Redis is unreachable, instead of its fair share.
    pub fallback_limit: Option<u32>,
    /// Callers of this process that may wait at once.
    pub queue_capacity: Option<usize>,
    /// Consecutive successes needed to leave PROBE.
    pub probe_successes: Option<u32>,
    /// The cooldown ladder, one step per consecutive wave, e.g. `["5s", "10s", "20s"]`.
    #[serde(default, deserialize_with = "duration::deserialize_list")]
    pub cooldown_ladder: Option<Vec<Duration>>,
    /// The shortest cooldown a `Retry-After` is clamped to.
    #[serde(default, deserialize_with = "duration::deserialize")]
    pub min_cooldown: Option<Duration>,
    /// The longest cooldown.
    #[serde(default, deserialize_with = "duration::deserialize")]
    pub max_cooldown: Option<Duration>,
    /// `adaptive` (the default) or `seed`.
    pub recovery: Option<RecoverySetting>,
    /// A requests-per-minute budget.
    pub requests_per_minute: Option<RateSetting>,
    /// A tokens-per-minute budget.
    pub tokens_per_minute: Option<RateSetting>,
    /// An input-tokens-per-minute budget, apart from the output (Anthropic's ITPM).
    pub input_tokens_per_minute: Option<RateSetting>,
    /// An output-tokens-per-minute budget, apart from the input (Anthropic's OTPM).
    pub output_tokens_per_minute: Option<RateSetting>,
    /// A requests-per-day budget, beside the per-minute one (Groq's RPD).
    pub requests_per_day: Option<DaySetting>,
    /// A tokens-per-day budget, beside the per-minute one (Groq's TPD).
    pub tokens_per_day: Option<DaySetting>,
    /// Priority classes, in order (`[[upstreams.<name>.classes]]`); see
    /// [`class`](crate::config::UpstreamConfigBuilder::class).
    #[serde(default)]
    pub classes: Vec<ClassSetting>,
    /// The class of requests that pick none (default: the first listed).
    pub default_class: Option<String>,
}

/// One priority class.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct ClassSetting {
    /// Its name.
    pub name: String,
    /// Its weight (1..=1000).
    pub weight: u32,
    /// The part of the limit kept for it while it waits, in percent (default 0).
    #[serde(default)]
    pub reserve_percent: u8,
    /// The most of the upstream's rate budgets it may use, in percent (default 100: no cap
    /// of its own).
    #[serde(default = "all_of_the_budget")]
    pub budget_percent: u8,
}

fn all_of_the_budget() -> u8 {
    100
}

/// How the limit recovers after a 429 (see [`Recovery`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum RecoverySetting {
    /// [`Recovery::Adaptive`].
    Adaptive,
    /// [`Recovery::Seed`].
    Seed,
}

/// A per-minute budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RateSetting {
    /// Units a minute.
    pub per_minute: u32,
    /// At most this many at once.
    pub burst: u32,
}

/// A per-day budget: `{ per_day = 14400 }` (a whole day's units at once, as the provider
/// refills its own) or `{ per_day = 14400, burst = 600 }`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DaySetting {
    /// Units a day.
    pub per_day: u64,
    /// At most this many at once (default: `per_day`).
    pub burst: Option<u64>,
}

impl Settings {
    /// Settings from a TOML document.
    pub fn from_toml(text: &str) -> Result<Self, SettingsError> {
        Self::from_sources(Some(text), std::iter::empty::<(String, String)>())
    }

    /// Settings from the process's environment (`WAVEGATE__...`) alone.
    pub fn from_env() -> Result<Self, SettingsError> {
        Self::from_sources(None, std::env::vars())
    }

    /// Settings from a TOML document (if any) with what `vars` say on top
    /// (`WAVEGATE__UPSTREAMS__LLM__LIMIT=10`; other variables are ignored). Pass
    /// `std::env::vars()` for the process's environment.
    pub fn from_sources<K, V>(text: Option<&str>, vars: impl IntoIterator<Item = (K, V)>) -> Result<Self, SettingsError>
    where
        K: AsRef<str>,
        V: AsRef<str>,
    {
        let invalid = |error: &dyn std::fmt::Display| SettingsError::Invalid(error.to_string());
        let mut table: toml::Table = match text {
            Some(text) => toml::from_str(text).map_err(|error| invalid(&error))?,
            None => toml::Table::new(),
        };
        for (key, value) in vars {
            let key = key.as_ref();
            let Some(path) = key.strip_prefix(ENV_PREFIX) else { continue };
            let path: Vec<String> = path.split("__").map(str::to_ascii_lowercase).collect();
            if path.iter().any(String::is_empty) {
                return Err(SettingsError::Invalid(format!("{key}: an empty level")));
            }
            set(&mut table, &path, env_value(value.as_ref()))
                .map_err(|what| SettingsError::Invalid(format!("{key}: {what}")))?;
        }
        toml::Value::Table(table).try_into().map_err(|error| invalid(&error))
    }

    /// A scheduler builder with these settings, each upstream validated by its builder (the
    /// same checks and messages as in code).
    pub fn builder(&self) -> Result<SchedulerBuilder, BuildError> {
        let mut builder = Scheduler::builder();
        #[cfg(not(feature = "redis"))]
        if let Some(url) = self.redis.as_ref().or(self.redis_sentinel.as_ref().map(|s| &s.master)) {
            return Err(BuildError::RedisNotBuilt { url: url.clone() });
        }
        #[cfg(feature = "redis")]
        let store = match (&self.redis, &self.redis_sentinel) {
            (url, Some(sentinel)) => Some(StoreConfig::sentinel(
                url.clone().unwrap_or_else(|| "redis://sentinel-managed/".to_owned()),
                sentinel.master.clone(),
                sentinel.sentinels.to_vec(),
            )),
            (Some(url), None) => Some(StoreConfig::new(url.clone())),
            (None, None) => None,
        };
        #[cfg(feature = "redis")]
        if let Some(mut store) = store {
            if let Some(timeout) = self.redis_command_timeout {
                store.command_timeout = timeout;
            }
            if let Some(timeout) = self.redis_connect_timeout {
                store.connect_timeout = timeout;
            }
            if let Some(prefix) = &self.redis_prefix {
                store.keyspace = wavegate_redis::Keyspace::new(prefix.clone());
            }
            if let Some(path) = &self.redis_root_certificate {
                let pem = std::fs::read(path).map_err(|error| {
                    StoreError::invalid(format!("redis_root_certificate {}: {error}", path.display()))
                })?;
                store.root_certificate = Some(pem);
            }
            builder = builder.store(store);
        }
        for (name, upstream) in &self.upstreams {
            builder = builder.upstream(upstream.config(name)?);
        }
        Ok(builder)
    }
}

impl UpstreamSettings {
    /// The validated configuration of upstream `name`.
    pub fn config(&self, name: &str) -> Result<UpstreamConfig, BuildError> {
        let mut builder = UpstreamConfig::builder(name);
        if let Some(limit) = self.limit {
            builder = builder.limit(limit);
        }
        if let Some(wait) = self.max_wait {
            builder = builder.max_wait(wait);
        }
        if let Some(timeout) = self.call_timeout {
            builder = builder.call_timeout(timeout);
        }
        if let Some(timeout) = self.total_timeout {
            builder = builder.total_timeout(timeout);
        }
        if let Some(hold) = self.cancelled_call_hold {
            builder = builder.cancelled_call_hold(hold);
        }
        if let Some(retry) = self.retry_transient {
            builder = builder.retry_transient(retry);
        }
        if let Some(weight) = self.cache_read_weight {
            builder = builder.cache_read_weight(weight);
        }
        if let Some(keeps) = self.keeps_estimate {
            builder = builder.keeps_estimate(keeps);
        }
        if let Some(lease) = self.renewed_lease {
            builder = builder.renewed_lease(lease);
        }
        if let Some(ttl) = self.permit_ttl {
            builder = builder.permit_ttl(ttl);
        }
        if let Some(limit) = self.fallback_limit {
            builder = builder.fallback_limit(limit);
        }
        if let Some(capacity) = self.queue_capacity {
            builder = builder.queue_capacity(capacity);
        }
        if let Some(successes) = self.probe_successes {
            builder = builder.probe_successes(successes);
        }
        if let Some(ladder) = &self.cooldown_ladder {
            builder = builder.cooldown_ladder(ladder.iter().copied());
        }
        if let Some(min) = self.min_cooldown {
            builder = builder.min_cooldown(min);
        }
        if let Some(max) = self.max_cooldown {
            builder = builder.max_cooldown(max);
        }
        if let Some(recovery) = self.recovery {
            builder = builder.recovery(match recovery {
                RecoverySetting::Adaptive => Recovery::Adaptive,
                RecoverySetting::Seed => Recovery::Seed,
            });
        }
        if let Some(RateSetting { per_minute, burst }) = self.requests_per_minute {
            builder = builder.requests_per_minute(per_minute, burst);
        }
        if let Some(RateSetting { per_minute, burst }) = self.tokens_per_minute {
            builder = builder.tokens_per_minute(per_minute, burst);
        }
        if let Some(RateSetting { per_minute, burst }) = self.input_tokens_per_minute {
            builder = builder.input_tokens_per_minute(per_minute, burst);
        }
        if let Some(RateSetting { per_minute, burst }) = self.output_tokens_per_minute {
            builder = builder.output_tokens_per_minute(per_minute, burst);
        }
        if let Some(DaySetting { per_day, burst }) = self.requests_per_day {
            builder = builder.requests_per_day(per_day, burst.unwrap_or(per_day));
        }
        if let Some(DaySetting { per_day, burst }) = self.tokens_per_day {
            builder = builder.tokens_per_day(per_day, burst.unwrap_or(per_day));
        }
        for class in &self.classes {
            builder = builder.class(class.name.clone(), class.weight);
            if class.reserve_percent > 0 {
                builder = builder.reserve(&class.name, class.reserve_percent);
            }
            if class.budget_percent != 100 {
                builder = builder.class_budget(&class.name, class.budget_percent);
            }
        }
        if let Some(default) = &self.default_class {
            builder = builder.default_class(default.clone());
        }
        Ok(builder.build()?)
    }
}

/// An environment value as TOML: an integer, a boolean, or a string.
fn env_value(value: &str) -> toml::Value {
    if let Ok(integer) = value.parse::<i64>() {
        toml::Value::Integer(integer)
    } else if let Ok(boolean) = value.parse::<bool>() {
        toml::Value::Boolean(boolean)
    } else {
        toml::Value::String(value.to_string())
    }
}

fn set(table: &mut toml::Table, path: &[String], value: toml::Value) -> Result<(), String> {
    let Some((last, parents)) = path.split_last() else { return Err("no key".to_string()) };
    let mut here = table;
    for (depth, key) in parents.iter().enumerate() {
        let entry = here.entry(key.clone()).or_insert_with(|| toml::Value::Table(toml::Table::new()));
        here = entry.as_table_mut().ok_or_else(|| format!("`{}` is not a table", parents[..=depth].join(".")))?;
    }
    here.insert(last.clone(), value);
    Ok(())
}

/// Parses `"250ms"`, `"25s"`, `"2m"`, `"1h"`, or a whole number of seconds.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: u64 = number.parse().map_err(|_| format!("`{text}` is not a duration (e.g. \"250ms\", \"25s\")"))?;
    let unit_ms = match unit.trim() {
        "ms" => 1,
        "" | "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        other => return Err(format!("`{other}` is not a unit of time (ms, s, m, h)")),
    };
    number.checked_mul(unit_ms).map(Duration::from_millis).ok_or_else(|| format!("`{text}` is too long"))
}

/// `Option<Duration>` from `"25s"` or a number of seconds.
mod duration {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer};

    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Text {
        Seconds(u64),
        Text(String),
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<Duration>, D::Error> {
        match Option::<Text>::deserialize(deserializer)? {
            None => Ok(None),
            Some(Text::Seconds(seconds)) => Ok(Some(Duration::from_secs(seconds))),
            Some(Text::Text(text)) => super::parse_duration(&text).map(Some).map_err(serde::de::Error::custom),
        }
    }

    pub(super) fn deserialize_list<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Option<Vec<Duration>>, D::Error> {
        let Some(steps) = Option::<Vec<Text>>::deserialize(deserializer)? else { return Ok(None) };
        let step = |text: Text| match text {
            Text::Seconds(seconds) => Ok(Duration::from_secs(seconds)),
            Text::Text(text) => super::parse_duration(&text).map_err(serde::de::Error::custom),
        };
        steps.into_iter().map(step).collect::<Result<_, _>>().map(Some)
    }
}
