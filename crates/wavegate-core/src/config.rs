//! Upstream configuration: documented defaults, refused at build time when it cannot work.
//!
//! Every check says what to change. The most important one ties the permit's lease to the
//! call timeout: a permit that expires while its call is still running lets a new call in and
//! the fleet goes over the limit. By default a watchdog renews every held permit every second,
//! a third of its 3 s lease, so a permit leaked by a killed process or a hiccup of the store
//! costs at most one lease: a killed process's permits stop holding their slots within 3 s of
//! its last renewal. A fixed TTL (the seed's 660 s, [`permit_ttl`](UpstreamConfigBuilder::permit_ttl))
//! is still available: then it must exceed the call timeout by a margin (10 % of the call
//! timeout, at least 1 s).
//!
//! ```
//! use std::time::Duration;
//! use wavegate_core::UpstreamConfig;
//!
//! let openai = UpstreamConfig::builder("openai").limit(20).build().unwrap();
//! assert_eq!(openai.permit_ttl(), Duration::from_secs(3));
//! assert_eq!(openai.renew_every(), Duration::from_secs(1));
//! assert!(openai.renews_leases());
//!
//! let fixed = UpstreamConfig::builder("openai").permit_ttl(Duration::from_secs(660)).build().unwrap();
//! assert!(!fixed.renews_leases());
//!
//! let err = UpstreamConfig::builder("openai")
//!     .permit_ttl(Duration::from_secs(30))
//!     .build()
//!     .unwrap_err();
//! assert!(err.to_string().contains("raise permit_ttl to at least 660s"));
//! ```

use std::collections::HashSet;
use std::fmt;

/// With priority classes, the watchdog renews held permits at least this often (see
/// [`UpstreamConfig::renew_every`]): the fleet's class shares count only recently renewed
/// permits, so a killed process's permits stop skewing them within three of these.
pub const CLASS_RENEWAL_EVERY: Duration = Duration::from_secs(1);
use std::num::{NonZeroU32, NonZeroUsize};
use std::time::Duration;

use crate::backoff::Backoff;
use crate::breaker::BreakerConfig;
use crate::cooldown::CooldownPolicy;
use crate::gcra::{Budgets, DayBudget, RateBudget};
use crate::priority::PriorityClass;
use crate::retry_budget::RetryBudgetConfig;
use crate::shadow::ShadowScope;
use crate::wave::Recovery;
use crate::wave::WaveConfig;

/// The most units a day budget may count a day: one a microsecond (86.4 × 10^9). The budgets'
/// times are whole microseconds, so a unit must take at least one: at 10^12 a day a request
/// moved the time by 0.09 µs, rounded away, and a burst of 10 granted 100.
pub const MAX_PER_DAY: u64 = 86_400_000_000;

/// A validated upstream name: 1–64 characters of `A-Z a-z 0-9 _ - .`.
///
/// Names become Redis hash tags (`{name}`) and metric labels, so braces, spaces and other
/// characters are refused.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct UpstreamName(String);

impl UpstreamName {
    /// The longest name accepted.
    pub const MAX_LEN: usize = 64;

    /// Checks and wraps a name.
    pub fn new(name: impl Into<String>) -> Result<Self, ConfigError> {
        let name = name.into();
        let reason = if name.is_empty() {
            Some("it is empty")
        } else if name.len() > Self::MAX_LEN {
            Some("it is longer than 64 characters")
        } else if !name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.')) {
            Some("it may only hold ASCII letters, digits, '_', '-' and '.'")
        } else {
            None
        };
        match reason {
            Some(reason) => Err(ConfigError::InvalidName { name, reason }),
            None => Ok(Self(name)),
        }
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for UpstreamName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl AsRef<str> for UpstreamName {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

/// A configuration that cannot work, with what to change.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The upstream name cannot be used.
    #[error("upstream name {name:?} is invalid: {reason}; choose 1-64 characters of A-Z, a-z, 0-9, '_', '-', '.'")]
    InvalidName {
        /// The name given.
        name: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A priority class cannot be used.
    #[error("priority class {class:?} is invalid: {reason}")]
    InvalidClass {
        /// The class (or classes) concerned.
        class: String,
        /// What is wrong, and what to change.
        reason: String,
    },
    /// The concurrency limit is zero.
    #[error("upstream `{upstream}`: limit is 0; set limit to at least 1 (the default is 10)")]
    ZeroLimit {
        /// The upstream.
        upstream: String,
    },
    /// The permit could expire while its call is still running.
    #[error(
        "upstream `{upstream}`: permit_ttl ({permit_ttl:?}) does not exceed call_timeout ({call_timeout:?}) \
         by the required margin; raise permit_ttl to at least {required:?}, lower call_timeout, or use \
         renewed_lease(..) so a watchdog keeps permits alive while their calls run"
    )]
    TtlTooShort {
        /// The upstream.
        upstream: String,
        /// The TTL given.
        permit_ttl: Duration,
        /// The call timeout given.
        call_timeout: Duration,
        /// The smallest TTL that would be accepted.
        required: Duration,
    },
    /// A duration that must be positive is zero.
    #[error("upstream `{upstream}`: {field} is zero; set it to a positive duration")]
    ZeroDuration {
        /// The upstream.
        upstream: String,
        /// The setting.
        field: &'static str,
    },
    /// A count that must be positive is zero.
    #[error("upstream `{upstream}`: {field} is 0; set it to at least 1")]
    ZeroCount {
        /// The upstream.
        upstream: String,
        /// The setting.
        field: &'static str,
    },
    /// A share outside its range.
    #[error("upstream `{upstream}`: {field} is {value}; set it within {range}")]
    OutOfRange {
        /// The upstream.
        upstream: String,
        /// The setting.
        field: &'static str,
        /// The value given.
        value: f64,
        /// The accepted range.
        range: &'static str,
    },
    /// The cooldown cap is below the first ladder step, so the ladder could never apply.
    #[error(
        "upstream `{upstream}`: max_cooldown ({max:?}) is below the first cooldown step ({first:?}); \
         raise max_cooldown to at least {first:?} or shorten the ladder's first step"
    )]
    CooldownCapBelowFirstStep {
        /// The upstream.
        upstream: String,
        /// The cap given.
        max: Duration,
        /// The first ladder step.
        first: Duration,
    },
    /// The shortest cooldown exceeds the longest.
    #[error("upstream `{upstream}`: min_cooldown ({min:?}) exceeds max_cooldown ({max:?}); lower min_cooldown")]
    CooldownMinAboveMax {
        /// The upstream.
        upstream: String,
        /// The minimum given.
        min: Duration,
        /// The maximum given.
        max: Duration,
    },
    /// The backoff cap is below its base.
    #[error("upstream `{upstream}`: backoff max ({max:?}) is below backoff base ({base:?}); raise the max")]
    BackoffMaxBelowBase {
        /// The upstream.
        upstream: String,
        /// The base.
        base: Duration,
        /// The max.
        max: Duration,
    },
    /// A renewed lease too short for the watchdog to renew it in time.
    #[error("upstream `{upstream}`: renewed lease ({lease:?}) is below {min:?}; raise it to at least {min:?}")]
    LeaseTooShort {
        /// The upstream.
        upstream: String,
        /// The lease given.
        lease: Duration,
        /// The shortest lease accepted.
        min: Duration,
    },
    /// The longest re-test spacing is below the first.
    #[error(
        "upstream `{upstream}`: the re-test spacing's max ({max:?}) is below its first step ({first:?}); \
         raise the max or lower the first step in retest_spacing(..)"
    )]
    RetestMaxBelowFirst {
        /// The upstream.
        upstream: String,
        /// The first spacing given.
        first: Duration,
        /// The max given.
        max: Duration,
    },
    /// A duration longer than wavegate accepts.
    #[error("upstream `{upstream}`: {field} ({value:?}) is longer than {max:?}; shorten it")]
    TooLong {
        /// The upstream.
        upstream: String,
        /// The setting.
        field: &'static str,
        /// The value given.
        value: Duration,
        /// The longest accepted.
        max: Duration,
    },
    /// Two upstreams share a name.
    #[error("upstream `{0}` is configured twice; give each upstream a distinct name")]
    DuplicateUpstream(String),
    /// A scheduler with nothing to schedule.
    #[error("no upstream is configured; add at least one with `UpstreamConfig::builder(name)`")]
    NoUpstreams,
}

/// The validated configuration of one upstream. Build it with [`UpstreamConfig::builder`].
#[derive(Debug, Clone, PartialEq)]
pub struct UpstreamConfig {
    name: UpstreamName,
    wave: WaveConfig,
    permit_ttl: Duration,
    renew_leases: bool,
    call_timeout: Duration,
    max_wait: Duration,
    total_timeout: Duration,
    fallback_limit: Option<NonZeroU32>,
    budgets: Budgets,
    queue_capacity: NonZeroUsize,
    breaker: BreakerConfig,
    retry_budget: RetryBudgetConfig,
    backoff: Backoff,
    /// Whether transient failures (500, 502, 503, 504, a reset, a timeout) are retried.
    retry_transient: bool,
    /// How long a spent quota keeps the upstream refused (issue 14).
    quota_pause: Duration,
    /// The provider keeps a served request's whole token estimate charged.
    keeps_estimate: bool,
    /// What a cached input read weighs in the input counted (unset: as reported).
    cache_read_weight: Option<f64>,
    classes: Vec<PriorityClass>,
    default_class: usize,
    /// How long a permit stays held after its call was cancelled at the provider.
    cancelled_call_hold: Duration,
    /// The calls that run in shadow (see [`ShadowScope`]).
    shadow: ShadowScope,
}

impl UpstreamConfig {
    /// The default concurrency limit: 10.
    pub const DEFAULT_LIMIT: u32 = 10;
    /// The default lease: 3 s, renewed every third of it (every second) by a watchdog while the
    /// call runs, so a killed process's permits stop holding their slots within 3 s of its last
    /// renewal. Safe under a stall of the store: a lease can end unrenewed only in a stall of
    /// more than 2 s, which every process notices first (its heartbeat and its renewals run
    /// every second, each bounded by the 250 ms command timeout) and answers with a fallback and
    /// a reconciliation that registers its permits again (`docs/guarantees.md`).
    pub const DEFAULT_LEASE: Duration = Duration::from_secs(3);
    /// The fixed permit TTL of the seed design (660 s): the smallest fixed TTL accepted with
    /// the default call timeout, for [`permit_ttl`](UpstreamConfigBuilder::permit_ttl).
    pub const DEFAULT_PERMIT_TTL: Duration = Duration::from_secs(660);
    /// The default call timeout: 600 s.
    pub const DEFAULT_CALL_TIMEOUT: Duration = Duration::from_secs(600);
    /// The default longest wait for a permit: 25 s.
    pub const DEFAULT_MAX_WAIT: Duration = Duration::from_secs(25);
    /// The default number of callers that may wait for a permit in one process: 1024.
    pub const DEFAULT_QUEUE_CAPACITY: usize = 1024;
    /// The shortest renewed lease: 1 s (renewed every third of it).
    pub const MIN_RENEWED_LEASE: Duration = Duration::from_secs(1);
    /// How long a spent quota (`insufficient_quota`) keeps the upstream refused in a process,
    /// unless an operator resets it sooner: 15 min.
    pub const DEFAULT_QUOTA_PAUSE: Duration = Duration::from_secs(15 * 60);
    /// The longest duration any setting accepts: 7 days.
    pub const MAX_DURATION: Duration = Duration::from_secs(7 * 24 * 3600);

    /// A builder with every default, for the upstream `name`.
    pub fn builder(name: impl Into<String>) -> UpstreamConfigBuilder {
        UpstreamConfigBuilder {
            name: name.into(),
            limit: Self::DEFAULT_LIMIT,
            probe_successes: WaveConfig::DEFAULT_PROBE_SUCCESSES.get(),
            cooldown: CooldownPolicy::default(),
            permit_ttl: Self::DEFAULT_LEASE,
            renew_leases: true,
            call_timeout: Self::DEFAULT_CALL_TIMEOUT,
            max_wait: Self::DEFAULT_MAX_WAIT,
            total_timeout: None,
            fallback_limit: None,
            recovery: Recovery::default(),
            retest: (WaveConfig::DEFAULT_RETEST_AFTER, WaveConfig::DEFAULT_RETEST_MAX),
            retest_rounds_max: WaveConfig::DEFAULT_RETEST_ROUNDS_MAX,
            requests_per_minute: None,
            tokens_per_minute: None,
            input_tokens_per_minute: None,
            output_tokens_per_minute: None,
            requests_per_day: None,
            tokens_per_day: None,
            queue_capacity: Self::DEFAULT_QUEUE_CAPACITY,
            breaker: BreakerConfig::default(),
            retry_budget: RetryBudgetConfig::default(),
            backoff: Backoff::default(),
            retry_transient: true,
            quota_pause: Self::DEFAULT_QUOTA_PAUSE,
            keeps_estimate: false,
            cache_read_weight: None,
            classes: Vec::new(),
            default_class: None,
            cancelled_call_hold: None,
            shadow: ShadowScope::none(),
        }
    }

    /// The smallest permit TTL accepted for a call timeout: the timeout plus 10 %, at least
    /// 1 s more.
    pub fn required_ttl(call_timeout: Duration) -> Duration {
        call_timeout.saturating_add((call_timeout / 10).max(Duration::from_secs(1)))
    }

    /// The upstream's name.
    pub fn name(&self) -> &UpstreamName {
        &self.name
    }
    /// The concurrency limit in NORMAL.
    pub fn limit(&self) -> NonZeroU32 {
        self.wave.base_limit
    }
    /// The same configuration with another concurrency limit (a live change: see
    /// [`LiveChange`](crate::LiveChange)); everything else, the fallback limit included, stays.
    pub fn with_limit(&self, limit: NonZeroU32) -> Self {
        let mut config = self.clone();
        config.wave.base_limit = limit;
        config
    }
    /// The same configuration with other budgets (a live change of a rate: see
    /// [`LiveSettings::apply_to`](crate::LiveSettings::apply_to)); everything else stays.
    pub fn with_budgets(&self, budgets: Budgets) -> Self {
        let mut config = self.clone();
        config.budgets = budgets;
        config
    }
    /// The same configuration with the priority classes' weights and reserves of `classes`
    /// (a live change: the same classes by name, in the same order; the budget shares and
    /// the default stay as configured).
    ///
    /// # Errors
    ///
    /// [`ConfigError::InvalidClass`] when `classes` are not this upstream's or their
    /// reserves add up to more than 100 %.
    pub fn with_class_shares(&self, classes: &[PriorityClass]) -> Result<Self, ConfigError> {
        let same = classes.len() == self.classes.len()
            && classes.iter().zip(&self.classes).all(|(new, old)| new.name() == old.name());
        if !same {
            return Err(ConfigError::InvalidClass {
                class: classes.iter().map(|c| c.name().to_owned()).collect::<Vec<_>>().join(", "),
                reason: format!("they are not the classes of upstream `{}`", self.name),
            });
        }
        let classes: Vec<PriorityClass> = classes
            .iter()
            .zip(&self.classes)
            .map(|(new, old)| {
                old.clone()
                    .weight(new.weight_value().get())
                    .and_then(|c| c.reserve_percent(new.reserve_percent_value()))
            })
            .collect::<Result<_, _>>()?;
        crate::priority::validate(self.name.as_str(), &classes)?;
        let mut config = self.clone();
        config.classes = classes;
        Ok(config)
    }
    /// The calls that run in shadow (see [`ShadowScope`]).
    pub fn shadow(&self) -> &ShadowScope {
        &self.shadow
    }
    /// Whether a call of class `class` (its index) runs in shadow.
    pub fn is_shadow(&self, class: usize) -> bool {
        self.shadow.covers(self.classes.get(class).map(|c| c.name()))
    }
    /// The same configuration with another shadow scope (a live change); everything else stays.
    pub fn with_shadow(&self, shadow: ShadowScope) -> Self {
        let mut config = self.clone();
        config.shadow = shadow;
        config
    }
    /// The wave machine's parameters (limit, probe successes, cooldown).
    pub fn wave(&self) -> &WaveConfig {
        &self.wave
    }
    /// How long a permit lives without being released (or renewed, see
    /// [`renews_leases`](Self::renews_leases)).
    pub fn permit_ttl(&self) -> Duration {
        self.permit_ttl
    }
    /// Whether a watchdog renews held permits every third of [`permit_ttl`](Self::permit_ttl),
    /// so a short lease is safe and a killed process's permits come back within one lease.
    pub fn renews_leases(&self) -> bool {
        self.renew_leases
    }
    /// How often the watchdog renews the permits a process holds (with
    /// [`renews_leases`](Self::renews_leases)): every third of the lease, and with priority
    /// classes at least every [`CLASS_RENEWAL_EVERY`], because the fleet's share of each class
    /// is counted from the permits renewed lately (see [`class_count_window`](Self::class_count_window)).
    pub fn renew_every(&self) -> Duration {
        let third = self.permit_ttl / 3;
        if self.classes.is_empty() { third } else { third.min(CLASS_RENEWAL_EVERY) }
    }
    /// With priority classes and renewed leases: a permit counts in its class's share of the
    /// fleet only while its lease ends at least this far ahead, i.e. while it was renewed within
    /// the last `lease - window` (three renewals). A permit of a process killed with `kill -9`
    /// stops counting after that, not when its lease ends (it still holds its place under the
    /// limit until then). Zero (every permit counts) without renewal or classes, and with the
    /// default 3 s lease (renewed every second: its lease itself ends within 3 s).
    pub fn class_count_window(&self) -> Duration {
        if !self.renew_leases || self.classes.is_empty() {
            return Duration::ZERO;
        }
        self.permit_ttl.saturating_sub(self.renew_every() * 3)
    }
    /// The whole call's time budget: permit waits, attempts and retries included.
    pub fn total_timeout(&self) -> Duration {
        self.total_timeout
    }
    /// How long one upstream call may run.
    pub fn call_timeout(&self) -> Duration {
        self.call_timeout
    }
    /// How long a caller may wait for a permit.
    pub fn max_wait(&self) -> Duration {
        self.max_wait
    }
    /// How long a permit stays held after its call was cancelled while its request was at the
    /// provider (the provider goes on serving it): the call timeout, unless configured shorter.
    pub fn cancelled_call_hold(&self) -> Duration {
        self.cancelled_call_hold
    }
    /// The limit this process uses while the shared store is down, when set; otherwise its
    /// fair share, `max(1, limit ÷ live processes last seen)`.
    pub fn fallback_limit(&self) -> Option<NonZeroU32> {
        self.fallback_limit
    }
    /// The fair share of the limit for one of `live` processes: `max(1, limit ÷ live)`, or the
    /// configured [`fallback_limit`](Self::fallback_limit).
    pub fn fallback_share(&self, live: u32) -> NonZeroU32 {
        self.fallback_limit
            .unwrap_or_else(|| NonZeroU32::new(self.limit().get() / live.max(1)).unwrap_or(NonZeroU32::MIN))
    }
    /// The requests-per-minute and tokens-per-minute budgets, if any.
    pub fn budgets(&self) -> Budgets {
        self.budgets
    }
    /// How many callers may wait for a permit in one process.
    pub fn queue_capacity(&self) -> NonZeroUsize {
        self.queue_capacity
    }
    /// The circuit breaker's parameters.
    pub fn breaker(&self) -> &BreakerConfig {
        &self.breaker
    }
    /// The retry budget's parameters.
    pub fn retry_budget(&self) -> &RetryBudgetConfig {
        &self.retry_budget
    }

    /// How long a spent quota keeps the upstream refused in a process.
    pub fn quota_pause(&self) -> Duration {
        self.quota_pause
    }

    /// Whether the provider keeps a served request's whole token estimate charged (see
    /// [`UpstreamConfigBuilder::keeps_estimate`]).
    pub fn keeps_estimate(&self) -> bool {
        self.keeps_estimate
    }

    /// What a cached input read weighs against the input budgets, if set (see
    /// [`UpstreamConfigBuilder::cache_read_weight`]).
    pub fn cache_read_weight(&self) -> Option<f64> {
        self.cache_read_weight
    }

    /// The priority classes, in configured order (empty: every caller is in one class).
    pub fn classes(&self) -> &[PriorityClass] {
        &self.classes
    }

    /// The index in [`classes`](Self::classes) of the class of requests that choose none (0
    /// without classes).
    pub fn default_class(&self) -> usize {
        self.default_class
    }

    /// The index of class `name`, if the upstream has it.
    pub fn class_index(&self, name: &str) -> Option<usize> {
        self.classes.iter().position(|c| c.name() == name)
    }

    /// The backoff for transient failures.
    pub fn backoff(&self) -> &Backoff {
        &self.backoff
    }

    /// Whether transient failures that may have reached the provider (500, 502, 503, 504, a
    /// reset, a timeout) are retried ([`UpstreamConfigBuilder::retry_transient`]).
    pub fn retries_transient(&self) -> bool {
        self.retry_transient
    }
}

/// Builds an [`UpstreamConfig`]; every setting has a documented default.
#[derive(Debug, Clone)]
#[must_use = "call `build()` to get the configuration"]
pub struct UpstreamConfigBuilder {
    name: String,
    limit: u32,
    probe_successes: u32,
    cooldown: CooldownPolicy,
    permit_ttl: Duration,
    renew_leases: bool,
    call_timeout: Duration,
    max_wait: Duration,
    total_timeout: Option<Duration>,
    fallback_limit: Option<u32>,
    recovery: Recovery,
    retest: (Duration, Duration),
    retest_rounds_max: u32,
    requests_per_minute: Option<(u32, u32)>,
    tokens_per_minute: Option<(u32, u32)>,
    input_tokens_per_minute: Option<(u32, u32)>,
    output_tokens_per_minute: Option<(u32, u32)>,
    requests_per_day: Option<(u64, u64)>,
    tokens_per_day: Option<(u64, u64)>,
    queue_capacity: usize,
    breaker: BreakerConfig,
    retry_budget: RetryBudgetConfig,
    backoff: Backoff,
    retry_transient: bool,
    quota_pause: Duration,
    keeps_estimate: bool,
    cache_read_weight: Option<f64>,
    /// (name, weight, reserve %), in order.
    /// (name, weight, reserve %, budget %).
    classes: Vec<(String, u32, u8, u8)>,
    default_class: Option<String>,
    cancelled_call_hold: Option<Duration>,
    shadow: ShadowScope,
}

impl UpstreamConfigBuilder {
    /// Concurrent calls allowed across the fleet in NORMAL. Default 10; must be at least 1.
    pub fn limit(mut self, limit: u32) -> Self {
        self.limit = limit;
        self
    }
    /// Consecutive successes needed to leave PROBE. Default 3.
    pub fn probe_successes(mut self, successes: u32) -> Self {
        self.probe_successes = successes;
        self
    }
    /// The cooldown ladder, one step per consecutive wave. Default 5, 10, 20, 30 s.
    pub fn cooldown_ladder(mut self, ladder: impl IntoIterator<Item = Duration>) -> Self {
        self.cooldown.ladder = ladder.into_iter().collect();
        self
    }
    /// The shortest cooldown a `Retry-After` is clamped to. Default 1 s.
    pub fn min_cooldown(mut self, min: Duration) -> Self {
        self.cooldown.min = min;
        self
    }
    /// The longest cooldown. Default 60 s; must be at least the ladder's first step.
    pub fn max_cooldown(mut self, max: Duration) -> Self {
        self.cooldown.max = max;
        self
    }
    /// A fixed permit TTL instead of the default renewed lease: a permit lives this long
    /// without being released, and nothing renews it. It must exceed the call timeout by 10 %
    /// (at least 1 s): 660 s with the default call timeout
    /// ([`DEFAULT_PERMIT_TTL`](UpstreamConfig::DEFAULT_PERMIT_TTL)). A permit leaked by a
    /// killed process or a hiccup of the store then holds a slot for the whole TTL.
    pub fn permit_ttl(mut self, ttl: Duration) -> Self {
        self.permit_ttl = ttl;
        self.renew_leases = false;
        self
    }
    /// Permits with a short lease that a watchdog renews every third of it while their calls
    /// run (one batched call per upstream), instead of a fixed TTL: a killed process's permits
    /// come back within one lease, and the call timeout is no longer bounded by the lease.
    /// At least 1 s. The default, with 3 s ([`DEFAULT_LEASE`](UpstreamConfig::DEFAULT_LEASE)).
    pub fn renewed_lease(mut self, lease: Duration) -> Self {
        self.permit_ttl = lease;
        self.renew_leases = true;
        self
    }
    /// The whole call's time budget, waits and retries included. Default: max_wait plus
    /// call_timeout.
    pub fn total_timeout(mut self, timeout: Duration) -> Self {
        self.total_timeout = Some(timeout);
        self
    }
    /// How long one upstream call may run. Default 600 s.
    pub fn call_timeout(mut self, timeout: Duration) -> Self {
        self.call_timeout = timeout;
        self
    }
    /// How long a caller may wait for a permit. Default 25 s.
    pub fn max_wait(mut self, wait: Duration) -> Self {
        self.max_wait = wait;
        self
    }
    /// How long a permit stays held after its call was cancelled while its request was at the
    /// provider (a client hung up and the handler was dropped): the provider goes on serving
    /// the request, so its slot under the limit stays taken until the provider has plausibly
    /// finished. Default: the call timeout; at most the call timeout. Zero gives the permit
    /// back at once (only for providers that stop work when the connection closes).
    pub fn cancelled_call_hold(mut self, hold: Duration) -> Self {
        self.cancelled_call_hold = Some(hold);
        self
    }
    /// The limit this process uses while Redis is down. Default: its fair share,
    /// `max(1, limit ÷ live processes last seen)`, so the fleet does not multiply the limit.
    pub fn fallback_limit(mut self, limit: u32) -> Self {
        self.fallback_limit = Some(limit);
        self
    }
    /// How the limit grows back after a cut. Default [`Recovery::Adaptive`], which stops
    /// hitting a provider whose real capacity is below the limit; [`Recovery::Seed`] is the
    /// recovery exactly as DESIGN walks it.
    pub fn recovery(mut self, recovery: Recovery) -> Self {
        self.recovery = recovery;
        self
    }
    /// [`Recovery::Adaptive`]: after a 429 steps the limit back, test the limit that drew it
    /// again no sooner than `first` later, doubling the spacing after each failed test up to
    /// `max`. Defaults 1 s and 8 s: each test costs one call one 429, and a capacity that grew
    /// is found within about `max`.
    pub fn retest_spacing(mut self, first: Duration, max: Duration) -> Self {
        self.retest = (first, max);
        self
    }
    /// [`Recovery::Adaptive`]: the most rounds (as many successes as the limit) held between
    /// two tests; they start at 1 and double after each failed test. Default 32: with long
    /// calls, at most one call in 32 × the limit is a test.
    pub fn retest_rounds_max(mut self, rounds: u32) -> Self {
        self.retest_rounds_max = rounds;
        self
    }
    /// A requests-per-minute budget shared by the fleet: `per_minute` requests a minute, at
    /// most `burst` at once (GCRA, exact in every sliding window: at most `per_minute + burst`
    /// in any minute). None by default.
    pub fn requests_per_minute(mut self, per_minute: u32, burst: u32) -> Self {
        self.requests_per_minute = Some((per_minute, burst));
        self
    }
    /// A tokens-per-minute budget shared by the fleet: callers reserve an estimate at acquire
    /// and settle the actual usage after the call. `burst` must cover the largest estimate.
    /// None by default.
    pub fn tokens_per_minute(mut self, per_minute: u32, burst: u32) -> Self {
        self.tokens_per_minute = Some((per_minute, burst));
        self
    }
    /// An input-tokens-per-minute budget shared by the fleet, apart from the output (as
    /// Anthropic limits input tokens, ITPM): each call reserves its estimate less its output
    /// part ([`RequestBuilder::output_tokens`](https://docs.rs/wavegate/latest/wavegate/struct.RequestBuilder.html#method.output_tokens)),
    /// settled to the usage after the call. `burst` must cover the largest prompt. None by
    /// default. With [`output_tokens_per_minute`](Self::output_tokens_per_minute), a call of
    /// 10,000 tokens in and 2,000 out fits ITPM 50,000 and OTPM 8,000, where one
    /// tokens budget would have to hold both. (Not divided among classes by
    /// [`class_budget`](Self::class_budget), not changed live, not learned from headers yet.)
    pub fn input_tokens_per_minute(mut self, per_minute: u32, burst: u32) -> Self {
        self.input_tokens_per_minute = Some((per_minute, burst));
        self
    }
    /// An output-tokens-per-minute budget shared by the fleet, apart from the input (as
    /// Anthropic limits output tokens, OTPM): each call reserves its output part (the
    /// request's `max_tokens`, [`RequestBuilder::output_tokens`](https://docs.rs/wavegate/latest/wavegate/struct.RequestBuilder.html#method.output_tokens)),
    /// settled to the output it produced. `burst` must cover the largest `max_tokens`. None
    /// by default.
    pub fn output_tokens_per_minute(mut self, per_minute: u32, burst: u32) -> Self {
        self.output_tokens_per_minute = Some((per_minute, burst));
        self
    }
    /// A requests-per-day budget shared by the fleet, besides the per-minute one (Groq's and
    /// Cerebras's RPD): `per_day` a day, refilled continuously, at most `burst` at once
    /// (`burst = per_day` is the provider's own bucket, a whole day's requests at once; a
    /// smaller one spreads the day). A call refused by it waits for its room, up to its
    /// deadline. `burst` at most `per_day`, both at most [`MAX_PER_DAY`] (one a microsecond). None by default. (Not divided
    /// among classes, not changed live, not learned from headers.)
    pub fn requests_per_day(mut self, per_day: u64, burst: u64) -> Self {
        self.requests_per_day = Some((per_day, burst));
        self
    }
    /// A tokens-per-day budget shared by the fleet, besides the per-minute one (Groq's and
    /// Cerebras's TPD): each call reserves its estimate, settled to the usage after the call,
    /// as the tokens per minute are. `burst` must cover the largest estimate, at most
    /// `per_day`; both at most [`MAX_PER_DAY`]. None by default.
    pub fn tokens_per_day(mut self, per_day: u64, burst: u64) -> Self {
        self.tokens_per_day = Some((per_day, burst));
        self
    }
    /// How many callers may wait for a permit in one process. Default 1024.
    pub fn queue_capacity(mut self, capacity: usize) -> Self {
        self.queue_capacity = capacity;
        self
    }
    /// The circuit breaker's parameters.
    pub fn breaker(mut self, breaker: BreakerConfig) -> Self {
        self.breaker = breaker;
        self
    }
    /// The retry budget's parameters.
    pub fn retry_budget(mut self, budget: RetryBudgetConfig) -> Self {
        self.retry_budget = budget;
        self
    }
    /// The backoff for transient failures.
    pub fn backoff(mut self, backoff: Backoff) -> Self {
        self.backoff = backoff;
        self
    }

    /// Whether transient failures are retried: 500, 502, 503 and 504 answers, a connection
    /// reset or closed before any byte of the answer, a timeout. Default `true`: each is
    /// retried after a full-jitter backoff ([`backoff`](Self::backoff)), at most
    /// `max_retries` times per call, each retry taken from the [retry budget](Self::retry_budget),
    /// all inside the call's deadline.
    ///
    /// `false` for calls that are not safe to repeat (a request that charges, sends or writes
    /// something each time it runs): any of these may have reached the provider and run there.
    /// A connect error (the request provably never left) and a refusal (429, 529, a 503 with
    /// `Retry-After`: the provider did not run it) are still retried; a pool does not move such
    /// a failed call on to its next member either.
    pub fn retry_transient(mut self, retry: bool) -> Self {
        self.retry_transient = retry;
        self
    }

    /// Says the provider charges a served request its whole token estimate and gives back
    /// nothing of it (OpenAI's rate limits charge prompt + `max_tokens` at admission): a
    /// settlement then never refunds below the reservation, so the tokens budget paces what the
    /// provider counts, not the smaller usage the answer reports (a request it refused, a 429
    /// or another 4xx, is still given back). Default `false`: settled to the reported usage.
    pub fn keeps_estimate(mut self, keeps: bool) -> Self {
        self.keeps_estimate = keeps;
        self
    }

    /// What a cached input read weighs, from 0 (free) to 1 (a full token), when a usage that
    /// names its cached reads (OpenAI's `cached_tokens`, Anthropic's `cache_read_input_tokens`:
    /// a streamed answer's `SseUsage`, `Permit::report_stream_usage`) settles the tokens and
    /// input budgets: the input counted is the uncached part plus the weight of each read.
    /// Unset by default: the input as the provider reports it (OpenAI's includes its cached
    /// reads, weight 1; Anthropic's leaves them out, weight 0, as its ITPM does for most
    /// models). Set 1.0 for an Anthropic model whose ITPM counts cache reads, 0.0 for a
    /// deployment that does not count OpenAI's. Outside `[0, 1]`: refused at build time.
    pub fn cache_read_weight(mut self, weight: f64) -> Self {
        self.cache_read_weight = Some(weight);
        self
    }

    /// How long a spent quota (a 429 of kind `quota_exhausted`) keeps the upstream refused in
    /// this process, unless an operator resets it sooner (`Scheduler::reset_quota`). Default
    /// [`UpstreamConfig::DEFAULT_QUOTA_PAUSE`] (15 min).
    pub fn quota_pause(mut self, pause: Duration) -> Self {
        self.quota_pause = pause;
        self
    }

    /// Adds a priority class of weight `weight` (1..=1000): with callers of several classes
    /// waiting, a free permit goes to the class furthest below its weighted share, across the
    /// fleet ([`priority`](crate::priority)). Requests choose theirs; those that do not are in
    /// the [`default_class`](Self::default_class). Without classes every caller is in one.
    pub fn class(mut self, name: impl Into<String>, weight: u32) -> Self {
        self.classes.push((name.into(), weight, 0, 100));
        self
    }

    /// Keeps `percent` of the current limit (rounded down to whole permits) for class `name`
    /// while it has callers waiting. The reserves of an upstream add up to at most 100 %.
    pub fn reserve(mut self, name: &str, percent: u8) -> Self {
        match self.classes.iter_mut().find(|(class, _, _, _)| class == name) {
            Some(class) => class.2 = percent,
            // Refused by `build()`: a reserve for a class that was not added.
            None => self.classes.push((name.to_owned(), 0, percent, 100)),
        }
        self
    }

    /// Lets class `name` use at most `percent` (1..=100) of the upstream's rate budgets
    /// (requests and tokens per minute, rate and burst), across the fleet; the rest is left
    /// for the other classes, even while this one is alone. Needs a budget
    /// ([`requests_per_minute`](Self::requests_per_minute) or
    /// [`tokens_per_minute`](Self::tokens_per_minute)).
    pub fn class_budget(mut self, name: &str, percent: u8) -> Self {
        match self.classes.iter_mut().find(|(class, _, _, _)| class == name) {
            Some(class) => class.3 = percent,
            // Refused by `build()`: a budget share for a class that was not added.
            None => self.classes.push((name.to_owned(), 0, 0, percent)),
        }
        self
    }

    /// Runs the upstream in shadow (or not): its whole policy runs — permits, budgets, windows,
    /// the breaker, the wave's learning — and records what it would have done (how long each
    /// call would have waited, which it would have refused), but never holds a call back; see
    /// [`ShadowScope`]. Switched on and off live with
    /// [`LiveChange::shadow`](crate::LiveChange::shadow). Default off.
    pub fn shadow(mut self, on: bool) -> Self {
        self.shadow = self.shadow.with_upstream(on);
        self
    }

    /// Runs priority class `name` in shadow (see [`shadow`](Self::shadow)): its calls are
    /// never held back; the other classes' are, and meet the shadow class's would-be permits
    /// as they would meet its permits.
    pub fn shadow_class(mut self, name: &str) -> Self {
        self.shadow = self.shadow.with_class(name, true);
        self
    }

    /// The class of requests that choose none; default: the first class added.
    pub fn default_class(mut self, name: impl Into<String>) -> Self {
        self.default_class = Some(name.into());
        self
    }

    /// Checks everything and returns the configuration, or the first problem found.
    pub fn build(self) -> Result<UpstreamConfig, ConfigError> {
        let name = UpstreamName::new(self.name)?;
        let upstream = || name.to_string();
        let in_upstream = |error: ConfigError| match error {
            ConfigError::InvalidClass { class, reason } => {
                ConfigError::InvalidClass { class, reason: format!("{reason} (upstream `{name}`)") }
            }
            other => other,
        };
        let mut classes = Vec::with_capacity(self.classes.len());
        for (class, weight, reserve, budget) in &self.classes {
            if *weight == 0 {
                return Err(in_upstream(ConfigError::InvalidClass {
                    class: class.clone(),
                    reason: "it has a reserve, a budget share or weight 0 but was never added; add it with \
                             `class(name, weight)` (weight at least 1) before its reserve or budget share"
                        .into(),
                }));
            }
            let made = PriorityClass::new(class.clone())
                .and_then(|c| c.weight(*weight))
                .and_then(|c| c.reserve_percent(*reserve))
                .and_then(|c| c.budget_percent(*budget))
                .map_err(in_upstream)?;
            classes.push(made);
        }
        crate::priority::validate(name.as_str(), &classes)?;
        let default_class = match &self.default_class {
            None => 0,
            Some(wanted) => {
                classes.iter().position(|c| c.name() == wanted).ok_or_else(|| ConfigError::InvalidClass {
                    class: wanted.clone(),
                    reason: format!(
                        "it is the default class of upstream `{name}` but is not one of its classes ({}); add it with \
                     `class(name, weight)`",
                        if classes.is_empty() {
                            "it has none".to_owned()
                        } else {
                            classes.iter().map(|c| c.name().to_owned()).collect::<Vec<_>>().join(", ")
                        }
                    ),
                })?
            }
        };
        if let Some(unknown) = self.shadow.classes().iter().find(|s| !classes.iter().any(|c| c.name() == s.as_str())) {
            return Err(ConfigError::InvalidClass {
                class: unknown.clone(),
                reason: format!(
                    "it is put in shadow (`shadow_class`) but is not a class of upstream `{name}`; add it with \
                     `class(name, weight)`, or put the whole upstream in shadow with `shadow(true)`"
                ),
            });
        }
        let zero_duration = |field| ConfigError::ZeroDuration { upstream: upstream(), field };
        let zero_count = |field| ConfigError::ZeroCount { upstream: upstream(), field };

        let limit = NonZeroU32::new(self.limit).ok_or_else(|| ConfigError::ZeroLimit { upstream: upstream() })?;
        let probe_successes = NonZeroU32::new(self.probe_successes).ok_or_else(|| zero_count("probe_successes"))?;
        let retest_rounds_max =
            NonZeroU32::new(self.retest_rounds_max).ok_or_else(|| zero_count("retest_rounds_max"))?.get();
        let queue_capacity = NonZeroUsize::new(self.queue_capacity).ok_or_else(|| zero_count("queue_capacity"))?;
        let fallback_limit =
            self.fallback_limit.map(|l| NonZeroU32::new(l).ok_or_else(|| zero_count("fallback_limit"))).transpose()?;
        let budget = |field: &'static str, value: Option<(u32, u32)>| {
            value.map(|(rate, burst)| RateBudget::new(rate, burst).ok_or_else(|| zero_count(field))).transpose()
        };
        let day_budget = |field: &'static str, value: Option<(u64, u64)>| {
            let Some((per_day, burst)) = value else { return Ok(None) };
            let out_of_range =
                |value: u64, range| ConfigError::OutOfRange { upstream: upstream(), field, value: value as f64, range };
            if per_day > MAX_PER_DAY {
                return Err(out_of_range(per_day, "[1, 86,400,000,000] a day (one a microsecond)"));
            }
            if burst > per_day {
                return Err(out_of_range(burst, "a burst of [1, the units per day]"));
            }
            DayBudget::new(per_day, burst).map(Some).ok_or_else(|| zero_count(field))
        };
        let budgets = Budgets {
            requests: budget("requests_per_minute (rate or burst)", self.requests_per_minute)?,
            tokens: budget("tokens_per_minute (rate or burst)", self.tokens_per_minute)?,
            input: budget("input_tokens_per_minute (rate or burst)", self.input_tokens_per_minute)?,
            output: budget("output_tokens_per_minute (rate or burst)", self.output_tokens_per_minute)?,
            requests_per_day: day_budget("requests_per_day", self.requests_per_day)?,
            tokens_per_day: day_budget("tokens_per_day", self.tokens_per_day)?,
        };
        if let Some(capped) = classes.iter().find(|c| c.budget_percent_value() < 100)
            && budgets.requests.is_none()
            && budgets.tokens.is_none()
        {
            return Err(ConfigError::InvalidClass {
                class: capped.name().to_owned(),
                reason: format!(
                    "it may use {} % of upstream `{name}`'s rate budgets, but the upstream has none; set \
                     requests_per_minute or tokens_per_minute, or remove its class_budget",
                    capped.budget_percent_value()
                ),
            });
        }
        for (field, value) in [
            ("call_timeout", self.call_timeout),
            ("max_wait", self.max_wait),
            ("min_cooldown", self.cooldown.min),
            ("breaker.window", self.breaker.window),
            ("breaker.open_for", self.breaker.open_for),
            ("retry_budget.ttl", self.retry_budget.ttl),
            ("backoff.base", self.backoff.base),
            ("breaker.probe_timeout", self.breaker.probe_timeout),
            ("retest_spacing (first)", self.retest.0),
            ("quota_pause", self.quota_pause),
        ] {
            if value.is_zero() {
                return Err(zero_duration(field));
            }
        }
        let cancelled_call_hold = self.cancelled_call_hold.unwrap_or(self.call_timeout).min(self.call_timeout);
        let total_timeout = self.total_timeout.unwrap_or(self.max_wait.saturating_add(self.call_timeout));
        if total_timeout.is_zero() {
            return Err(zero_duration("total_timeout"));
        }
        let max = UpstreamConfig::MAX_DURATION;
        for (field, value) in [
            ("call_timeout", self.call_timeout),
            ("max_wait", self.max_wait),
            ("quota_pause", self.quota_pause),
            ("total_timeout", total_timeout),
            ("permit_ttl", self.permit_ttl),
            ("max_cooldown", self.cooldown.max),
            ("breaker.window", self.breaker.window),
            ("breaker.open_for", self.breaker.open_for),
            ("breaker.probe_timeout", self.breaker.probe_timeout),
            ("retry_budget.ttl", self.retry_budget.ttl),
            ("backoff.max", self.backoff.max),
            ("retest_spacing (max)", self.retest.1),
        ] {
            if value > max {
                return Err(ConfigError::TooLong { upstream: upstream(), field, value, max });
            }
        }
        let Some(&first) = self.cooldown.ladder.first() else {
            return Err(zero_count("cooldown_ladder steps"));
        };
        if self.cooldown.ladder.iter().any(Duration::is_zero) {
            return Err(zero_duration("a cooldown_ladder step"));
        }
        if self.cooldown.max < first {
            return Err(ConfigError::CooldownCapBelowFirstStep { upstream: upstream(), max: self.cooldown.max, first });
        }
        if self.retest.1 < self.retest.0 {
            return Err(ConfigError::RetestMaxBelowFirst {
                upstream: upstream(),
                first: self.retest.0,
                max: self.retest.1,
            });
        }
        if self.cooldown.min > self.cooldown.max {
            return Err(ConfigError::CooldownMinAboveMax {
                upstream: upstream(),
                min: self.cooldown.min,
                max: self.cooldown.max,
            });
        }
        let required = UpstreamConfig::required_ttl(self.call_timeout);
        if self.renew_leases {
            if self.permit_ttl < UpstreamConfig::MIN_RENEWED_LEASE {
                return Err(ConfigError::LeaseTooShort {
                    upstream: upstream(),
                    lease: self.permit_ttl,
                    min: UpstreamConfig::MIN_RENEWED_LEASE,
                });
            }
        } else if self.permit_ttl < required {
            return Err(ConfigError::TtlTooShort {
                upstream: upstream(),
                permit_ttl: self.permit_ttl,
                call_timeout: self.call_timeout,
                required,
            });
        }
        if self.breaker.minimum_calls == 0 {
            return Err(zero_count("breaker.minimum_calls"));
        }
        if self.breaker.half_open_probes == 0 {
            return Err(zero_count("breaker.half_open_probes"));
        }
        let rate = self.breaker.failure_rate;
        if !(rate > 0.0 && rate <= 1.0) {
            return Err(ConfigError::OutOfRange {
                upstream: upstream(),
                field: "breaker.failure_rate",
                value: rate,
                range: "(0, 1]",
            });
        }
        if let Some(weight) = self.cache_read_weight
            && !(0.0..=1.0).contains(&weight)
        {
            return Err(ConfigError::OutOfRange {
                upstream: upstream(),
                field: "cache_read_weight",
                value: weight,
                range: "[0, 1]",
            });
        }
        let ratio = self.retry_budget.ratio;
        if !(0.0..=1.0).contains(&ratio) {
            return Err(ConfigError::OutOfRange {
                upstream: upstream(),
                field: "retry_budget.ratio",
                value: ratio,
                range: "[0, 1]",
            });
        }
        if self.backoff.max < self.backoff.base {
            return Err(ConfigError::BackoffMaxBelowBase {
                upstream: upstream(),
                base: self.backoff.base,
                max: self.backoff.max,
            });
        }
        Ok(UpstreamConfig {
            name,
            wave: WaveConfig {
                base_limit: limit,
                probe_successes,
                cooldown: self.cooldown,
                recovery: self.recovery,
                retest_after: self.retest.0,
                retest_max: self.retest.1,
                retest_rounds_max,
            },
            permit_ttl: self.permit_ttl,
            renew_leases: self.renew_leases,
            call_timeout: self.call_timeout,
            max_wait: self.max_wait,
            total_timeout,
            fallback_limit,
            budgets,
            queue_capacity,
            breaker: self.breaker,
            retry_budget: self.retry_budget,
            backoff: self.backoff,
            retry_transient: self.retry_transient,
            keeps_estimate: self.keeps_estimate,
            cache_read_weight: self.cache_read_weight,
            quota_pause: self.quota_pause,
            classes,
            default_class,
            cancelled_call_hold,
            shadow: self.shadow,
        })
    }
}

/// A name that is not among the configured upstreams.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown upstream `{name}`; configured upstreams: {known}")]
pub struct UnknownUpstream {
    /// The name asked for.
    pub name: String,
    /// The configured names, comma-separated.
    pub known: String,
}

/// The upstreams of one scheduler: at least one, names distinct.
#[derive(Debug, Clone, PartialEq)]
pub struct UpstreamSet {
    upstreams: Vec<UpstreamConfig>,
}

impl UpstreamSet {
    /// Checks that there is at least one upstream and that no name repeats.
    pub fn new(upstreams: impl IntoIterator<Item = UpstreamConfig>) -> Result<Self, ConfigError> {
        let upstreams: Vec<UpstreamConfig> = upstreams.into_iter().collect();
        if upstreams.is_empty() {
            return Err(ConfigError::NoUpstreams);
        }
        let mut seen = HashSet::new();
        for upstream in &upstreams {
            if !seen.insert(upstream.name()) {
                return Err(ConfigError::DuplicateUpstream(upstream.name().to_string()));
            }
        }
        Ok(Self { upstreams })
    }

    /// The configuration of upstream `name`.
    pub fn get(&self, name: &str) -> Result<&UpstreamConfig, UnknownUpstream> {
        self.upstreams.iter().find(|u| u.name().as_str() == name).ok_or_else(|| UnknownUpstream {
            name: name.chars().take(UpstreamName::MAX_LEN).collect(),
            known: self.upstreams.iter().map(|u| u.name().as_str()).collect::<Vec<_>>().join(", "),
        })
    }

    /// All upstreams, in configuration order.
    pub fn iter(&self) -> impl Iterator<Item = &UpstreamConfig> {
        self.upstreams.iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(builder: UpstreamConfigBuilder) -> String {
        builder.build().expect_err("the configuration must be refused").to_string()
    }

    #[test]
    fn defaults_match_the_design() {
        let config = UpstreamConfig::builder("img").build().expect("defaults are valid");
        assert_eq!(config.limit().get(), 10);
        assert_eq!(config.permit_ttl(), Duration::from_secs(3));
        assert!(config.renews_leases(), "a renewed lease is the default: a leak costs at most one lease");
        assert_eq!(config.call_timeout(), Duration::from_secs(600));
        assert_eq!(config.max_wait(), Duration::from_secs(25));
        assert_eq!(config.wave().probe_successes.get(), 3);
        assert_eq!(config.wave().cooldown.ladder(), CooldownPolicy::DEFAULT_LADDER);
        assert_eq!(config.retry_budget().ratio, 0.2);
        let fixed = UpstreamConfig::builder("img").permit_ttl(UpstreamConfig::DEFAULT_PERMIT_TTL).build();
        let fixed = fixed.expect("the seed's fixed TTL is valid with the default call timeout");
        assert!(!fixed.renews_leases());
        assert_eq!(fixed.permit_ttl(), Duration::from_secs(660));
        assert_eq!(config.fallback_share(4).get(), 2);
        assert_eq!(config.fallback_share(0).get(), 10);
        assert_eq!(config.fallback_share(40).get(), 1);
        assert_eq!(config.total_timeout(), Duration::from_secs(625));
        let renewed = UpstreamConfig::builder("img").renewed_lease(Duration::from_secs(2)).build().expect("valid");
        assert!(renewed.renews_leases(), "a renewed lease is not bounded by the call timeout");
        assert_eq!(renewed.permit_ttl(), Duration::from_secs(2));
    }

    #[test]
    fn with_classes_permits_are_renewed_every_second_and_counted_while_renewed_lately() {
        let default = UpstreamConfig::builder("llm").build().expect("valid");
        assert_eq!(default.renew_every(), Duration::from_secs(1), "the default 3 s lease, renewed every second");
        let plain = UpstreamConfig::builder("llm").renewed_lease(Duration::from_secs(30)).build().expect("valid");
        assert_eq!(plain.renew_every(), Duration::from_secs(10), "a third of the lease");
        assert_eq!(plain.class_count_window(), Duration::ZERO, "no classes: every permit counts");
        let classes = UpstreamConfig::builder("llm").class("interactive", 3).class("batch", 1);
        let config = classes.clone().renewed_lease(Duration::from_secs(30)).build().expect("valid");
        assert_eq!(config.renew_every(), CLASS_RENEWAL_EVERY);
        assert_eq!(config.class_count_window(), Duration::from_secs(27), "renewed within the last 3 s");
        let default = classes.clone().build().expect("valid");
        assert_eq!(default.class_count_window(), Duration::ZERO, "the default lease is three renewals");
        let short = classes.clone().renewed_lease(Duration::from_secs(3)).build().expect("valid");
        assert_eq!(short.renew_every(), Duration::from_secs(1));
        assert_eq!(short.class_count_window(), Duration::ZERO, "three renewals fill the lease: every permit counts");
        let fixed = classes.permit_ttl(UpstreamConfig::DEFAULT_PERMIT_TTL).build().expect("valid");
        assert_eq!(fixed.class_count_window(), Duration::ZERO, "a fixed TTL is never renewed: every permit counts");
    }

    #[test]
    fn each_refusal_says_what_to_change() {
        let b = || UpstreamConfig::builder("llm");
        let cases = [
            (b().limit(0), "set limit to at least 1"),
            (b().permit_ttl(Duration::from_secs(600)), "raise permit_ttl to at least 660s"),
            (b().call_timeout(Duration::from_secs(5)).permit_ttl(Duration::from_secs(5)), "at least 6s"),
            (b().max_cooldown(Duration::from_secs(2)), "raise max_cooldown to at least 5s"),
            (b().min_cooldown(Duration::from_secs(61)), "lower min_cooldown"),
            (b().cooldown_ladder([]), "cooldown_ladder steps is 0"),
            (b().cooldown_ladder([Duration::ZERO]), "a cooldown_ladder step is zero"),
            (b().max_wait(Duration::ZERO), "max_wait is zero"),
            (b().total_timeout(Duration::ZERO), "total_timeout is zero"),
            (b().max_wait(Duration::MAX), "max_wait (18446744073709551615.999999999s) is longer than 604800s"),
            (b().max_cooldown(Duration::from_secs(8 * 24 * 3600)), "max_cooldown (691200s) is longer than 604800s"),
            (b().renewed_lease(Duration::from_millis(500)), "raise it to at least 1s"),
            (b().permit_ttl(Duration::from_secs(60)), "use renewed_lease(..)"),
            (b().queue_capacity(0), "queue_capacity is 0"),
            (b().fallback_limit(0), "fallback_limit is 0"),
            (b().requests_per_minute(0, 5), "requests_per_minute (rate or burst) is 0"),
            (b().tokens_per_minute(1000, 0), "tokens_per_minute (rate or burst) is 0"),
            (b().probe_successes(0), "probe_successes is 0"),
            (b().retest_spacing(Duration::ZERO, Duration::from_secs(1)), "retest_spacing (first) is zero"),
            (b().retest_rounds_max(0), "retest_rounds_max is 0"),
            (b().retest_spacing(Duration::from_secs(2), Duration::from_secs(1)), "lower the first step"),
            (b().retest_spacing(Duration::from_secs(1), Duration::from_secs(8 * 24 * 3600)), "is longer than"),
            (b().breaker(BreakerConfig { failure_rate: 1.5, ..Default::default() }), "within (0, 1]"),
            (b().breaker(BreakerConfig { failure_rate: f64::NAN, ..Default::default() }), "within (0, 1]"),
            (b().retry_budget(RetryBudgetConfig { ratio: -0.1, ..Default::default() }), "within [0, 1]"),
            (
                b().backoff(Backoff { base: Duration::from_secs(2), max: Duration::from_secs(1), max_retries: 1 }),
                "raise the max",
            ),
        ];
        for (builder, hint) in cases {
            let message = refused(builder);
            assert!(message.contains(hint), "{message:?} should contain {hint:?}");
            assert!(message.contains("`llm`"), "{message:?} should name the upstream");
        }
    }

    #[test]
    fn names_that_cannot_be_hash_tags_are_refused() {
        for bad in ["", "a{b}", "with space", "ü", &"x".repeat(65)] {
            let message = refused(UpstreamConfig::builder(bad));
            assert!(message.contains("choose 1-64 characters"), "{message}");
        }
        assert!(UpstreamConfig::builder("openai.gpt-4o_mini").build().is_ok());
    }

    #[test]
    fn upstream_sets_refuse_duplicates_and_name_the_known_ones() {
        let a = || UpstreamConfig::builder("a").build().expect("valid");
        let b = UpstreamConfig::builder("b").build().expect("valid");
        assert_eq!(UpstreamSet::new([a(), a()]), Err(ConfigError::DuplicateUpstream("a".into())));
        assert_eq!(UpstreamSet::new([]), Err(ConfigError::NoUpstreams));
        let set = UpstreamSet::new([a(), b]).expect("valid");
        let unknown = set.get("c").expect_err("unknown");
        assert_eq!(unknown.to_string(), "unknown upstream `c`; configured upstreams: a, b");
        assert_eq!(set.get("b").map(|u| u.name().as_str()), Ok("b"));
    }
}
